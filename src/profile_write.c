/* profile_write.c: heap profiles written as pprof's profile.proto, gzipped (protobuf-c's code generated from
 * proto/profile.proto, and zlib), at exit, every THREADHEAP_PROFILE_INTERVAL seconds, on SIGUSR2 and on
 * th_profile_dump; and the leak report at exit (THREADHEAP_LEAKS). Nothing here allocates from the heaps
 * it profiles: the message, its tables and zlib's state live in a scratch mapping unmapped afterwards, so a
 * profile can be written from a malloc slow path. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "internal.h"
#include "os.h"
#include "profile.h"
#include "profile.pb-c.h"

/* ---- zlib and protobuf-c, opened with dlopen when profiling starts (profile_writer_open), so that a process
 * that does not profile maps neither (docs/design.md, "Resident size at start"). The generated code's own
 * references to protobuf-c are weak (CMakeLists.txt) and never called: packing goes through lib.pack. */

static struct {
  /* pack is looked up last, so it is set only when everything is: it says whether profiles can be written */
  __typeof__(deflateInit2_) *deflate_init;
  __typeof__(deflate) *deflate;
  __typeof__(deflateEnd) *deflate_end;
  __typeof__(protobuf_c_message_pack_to_buffer) *pack;
} lib;

/* The one string the generated descriptors refer to, defined here rather than taken from libprotobuf-c. */
const char protobuf_c_empty_string[] __attribute__((visibility("hidden"))) = "";

#define LIB_SYMBOL(handle, field, name) (lib.field = (__typeof__(lib.field))dlsym(handle, name)) != NULL

/* dlopen of soname, or NULL with dlerror's words copied to why (the next dl call may overwrite them). */
void *profile_open_lib(const char *soname, char *why, size_t cap) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  const char *e = h ? NULL : dlerror();
  if (e && why[0] == '\0') snprintf(why, cap, "%s", e);
  return h;
}

void profile_writer_open(void) {
  char why[256] = "";
  void *z = profile_open_lib("libz.so.1", why, sizeof why);
  void *pb = profile_open_lib("libprotobuf-c.so.1", why, sizeof why);
  if (z && pb && LIB_SYMBOL(z, deflate_init, "deflateInit2_") && LIB_SYMBOL(z, deflate, "deflate") &&
      LIB_SYMBOL(z, deflate_end, "deflateEnd") && LIB_SYMBOL(pb, pack, "protobuf_c_message_pack_to_buffer"))
    return;
  char line[512];
  int n = snprintf(line, sizeof line, "threadheap: heap profiles need libz.so.1 and libprotobuf-c.so.1 (%s); "
                   "none will be written\n", why[0] ? why : "a function is missing");
  os_write_err(line, n > 0 && (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* ---- scratch memory: one mapping per profile, bump-allocated, zeroed by the kernel */

typedef struct scratch_s {
  uint8_t *base;
  size_t used, cap;
} scratch_t;

static void *scratch_alloc(scratch_t *s, size_t n) {
  n = align_up(n ? n : 1, 16);
  if (s->used + n > s->cap) return NULL;
  void *p = s->base + s->used;
  s->used += n;
  return p;
}

/* ---- the string table and the location and function tables, each an open-addressing hash in scratch */

typedef struct strings_s {
  char **text;        /* string_table */
  size_t n, cap;
  uint32_t *slot;     /* index + 1, by hash; 0: empty */
  size_t slots;
} strings_t;

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

/* The index of s in the string table, added if new; 0 ("") when out of room. */
static int64_t string_id(scratch_t *sc, strings_t *t, const char *s) {
  size_t len = strlen(s);
  for (size_t i = hash_bytes(s, len) & (t->slots - 1);; i = (i + 1) & (t->slots - 1)) {
    uint32_t k = t->slot[i];
    if (k == 0) {
      if (t->n == t->cap) return 0;
      char *copy = scratch_alloc(sc, len + 1);
      if (copy == NULL) return 0;
      memcpy(copy, s, len + 1);
      t->text[t->n] = copy;
      t->slot[i] = (uint32_t)++t->n;
      return (int64_t)t->n - 1;
    }
    if (strcmp(t->text[k - 1], s) == 0) return (int64_t)k - 1;
  }
}

typedef struct ids_s {
  uint64_t *key;
  uint32_t *id; /* 0: empty */
  size_t slots;
} ids_t;

/* The slot of key: *found says whether it holds key already. */
static size_t ids_slot(const ids_t *t, uint64_t key, bool *found) {
  size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (t->slots - 1);
  while (t->id[i] != 0 && t->key[i] != key) i = (i + 1) & (t->slots - 1);
  *found = t->id[i] != 0;
  return i;
}

/* ---- building the message */

typedef struct builder_s {
  scratch_t sc;
  strings_t str;
  ids_t loc_ids, fn_ids;
  Perftools__Profiles__Location **loc;
  size_t n_loc, cap_loc;
  Perftools__Profiles__Function **fn;
  size_t n_fn;
  Perftools__Profiles__Mapping **map;
  size_t n_map;
} builder_t;

static size_t pow2_at_least(size_t n) {
  size_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

static bool builder_init(builder_t *b, size_t stacks, size_t frames) {
  memset(b, 0, sizeof *b);
  size_t locs = frames + 16, strs = 2 * frames + 256;
  b->sc.cap = (size_t)4 << 20;
  b->sc.cap += stacks * (sizeof(Perftools__Profiles__Sample) + 7 * sizeof(int64_t) + 64);
  b->sc.cap += frames * (sizeof(uint64_t) + 2 * sizeof(Perftools__Profiles__Location) + 2 * sizeof(Perftools__Profiles__Line) +
                         2 * sizeof(Perftools__Profiles__Function) + 4 * sizeof(void *) + 160);
  b->sc.cap += pow2_at_least(2 * locs) * 24 + pow2_at_least(2 * strs) * 8 + strs * sizeof(char *);
  b->sc.cap = align_up(b->sc.cap + ((size_t)1 << 20), (size_t)1 << 20);
  b->sc.base = os_reserve_rw(b->sc.cap);
  if (b->sc.base == NULL) return false;
  b->str.cap = strs;
  b->str.text = scratch_alloc(&b->sc, strs * sizeof(char *));
  b->str.slots = pow2_at_least(2 * strs);
  b->str.slot = scratch_alloc(&b->sc, b->str.slots * sizeof(uint32_t));
  b->loc_ids.slots = b->fn_ids.slots = pow2_at_least(2 * locs);
  b->loc_ids.key = scratch_alloc(&b->sc, b->loc_ids.slots * sizeof(uint64_t));
  b->loc_ids.id = scratch_alloc(&b->sc, b->loc_ids.slots * sizeof(uint32_t));
  b->fn_ids.key = scratch_alloc(&b->sc, b->fn_ids.slots * sizeof(uint64_t));
  b->fn_ids.id = scratch_alloc(&b->sc, b->fn_ids.slots * sizeof(uint32_t));
  b->cap_loc = locs;
  b->loc = scratch_alloc(&b->sc, locs * sizeof(void *));
  b->fn = scratch_alloc(&b->sc, locs * sizeof(void *));
  if (!b->str.text || !b->str.slot || !b->loc_ids.key || !b->loc_ids.id || !b->fn_ids.key || !b->fn_ids.id ||
      !b->loc || !b->fn)
    return false;
  string_id(&b->sc, &b->str, ""); /* entry 0 */
  return true;
}

/* The executable file mappings of /proc/self/maps, with their build ids. */
static void add_mappings(builder_t *b) {
  size_t cap = (size_t)1 << 20;
  char *text = scratch_alloc(&b->sc, cap + 1);
  size_t n = text ? os_read_file("/proc/self/maps", text, cap) : 0;
  if (n == 0) return;
  text[n] = '\0';
  size_t lines = 1;
  for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
  b->map = scratch_alloc(&b->sc, lines * sizeof(void *));
  if (b->map == NULL) return;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    unsigned long lo, hi, off;
    char perms[8];
    int path_at = 0;
    if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %n", &lo, &hi, perms, &off, &path_at) < 4 || path_at == 0) continue;
    const char *path = line + path_at;
    if (perms[2] != 'x' || (path[0] != '/' && strcmp(path, "[vdso]") != 0)) continue;
    Perftools__Profiles__Mapping *m = scratch_alloc(&b->sc, sizeof *m);
    if (m == NULL) return;
    perftools__profiles__mapping__init(m);
    m->id = b->n_map + 1;
    m->memory_start = lo;
    m->memory_limit = hi;
    m->file_offset = off;
    m->filename = string_id(&b->sc, &b->str, path);
    char id[81];
    if (os_build_id(lo, id)) m->build_id = string_id(&b->sc, &b->str, id);
    b->map[b->n_map++] = m;
  }
}

static uint64_t mapping_of(const builder_t *b, uintptr_t pc) {
  for (size_t i = 0; i < b->n_map; i++)
    if (pc >= b->map[i]->memory_start && pc < b->map[i]->memory_limit) return b->map[i]->id;
  return 0;
}

/* The function named by the symbol table at pc (dladdr), as a function id; 0 if none. */
static uint64_t function_at(builder_t *b, uintptr_t pc) {
  Dl_info info;
  if (dladdr((void *)pc, &info) == 0 || info.dli_sname == NULL) return 0;
  int64_t name = string_id(&b->sc, &b->str, info.dli_sname);
  if (name == 0) return 0;
  bool found;
  size_t i = ids_slot(&b->fn_ids, (uint64_t)name, &found);
  if (found) return b->fn_ids.id[i];
  Perftools__Profiles__Function *f = scratch_alloc(&b->sc, sizeof *f);
  if (f == NULL || b->n_fn == b->cap_loc) return 0;
  perftools__profiles__function__init(f);
  f->id = b->n_fn + 1;
  f->name = f->system_name = name;
  if (info.dli_fname) f->filename = string_id(&b->sc, &b->str, info.dli_fname);
  b->fn[b->n_fn++] = f;
  b->fn_ids.key[i] = (uint64_t)name;
  b->fn_ids.id[i] = (uint32_t)f->id;
  return f->id;
}

static uint64_t location_of(builder_t *b, uintptr_t pc) {
  bool found;
  size_t i = ids_slot(&b->loc_ids, pc, &found);
  if (found) return b->loc_ids.id[i];
  if (b->n_loc == b->cap_loc) return 0;
  Perftools__Profiles__Location *l = scratch_alloc(&b->sc, sizeof *l);
  if (l == NULL) return 0;
  perftools__profiles__location__init(l);
  l->id = b->n_loc + 1;
  l->address = pc;
  l->mapping_id = mapping_of(b, pc);
  uint64_t fn = function_at(b, pc);
  if (fn != 0) {
    Perftools__Profiles__Line *line = scratch_alloc(&b->sc, sizeof *line);
    Perftools__Profiles__Line **lines = scratch_alloc(&b->sc, sizeof *lines);
    if (line && lines) {
      perftools__profiles__line__init(line);
      line->function_id = fn;
      lines[0] = line;
      l->line = lines;
      l->n_line = 1;
    }
  }
  b->loc[b->n_loc++] = l;
  b->loc_ids.key[i] = pc;
  b->loc_ids.id[i] = (uint32_t)l->id;
  return l->id;
}

static const char *const type_names[][2] = {
    {"alloc_objects", "count"}, {"alloc_space", "bytes"}, {"inuse_objects", "count"}, {"inuse_space", "bytes"},
    {"peak_objects", "count"},  {"peak_space", "bytes"},  {"fresh_space", "bytes"},
};
#define N_TYPES (sizeof type_names / sizeof type_names[0])

static void stack_values(profile_stack_t *s, int64_t v[N_TYPES]) {
  v[0] = (int64_t)(atomic_load_explicit(&s->alloc_count, memory_order_relaxed) / PROFILE_COUNT_ONE);
  v[1] = (int64_t)atomic_load_explicit(&s->alloc_bytes, memory_order_relaxed);
  v[2] = (int64_t)(atomic_load_explicit(&s->live_count, memory_order_relaxed) / PROFILE_COUNT_ONE);
  v[3] = (int64_t)atomic_load_explicit(&s->live_bytes, memory_order_relaxed);
  v[4] = (int64_t)(atomic_load_explicit(&s->peak_count, memory_order_relaxed) / PROFILE_COUNT_ONE);
  v[5] = (int64_t)atomic_load_explicit(&s->peak_bytes, memory_order_relaxed);
  v[6] = (int64_t)atomic_load_explicit(&s->fresh_bytes, memory_order_relaxed);
  for (size_t i = 0; i < N_TYPES; i++)
    if (v[i] < 0) v[i] = 0; /* a free counted before its allocation, read in between */
}

/* ---- writing: protobuf-c packs into a buffer whose append deflates into the file */

typedef struct gz_out_s {
  ProtobufCBuffer base; /* first: protobuf-c calls append with a pointer to it */
  z_stream z;
  uint8_t *out;
  size_t out_cap;
  int fd;
  bool ok;
} gz_out_t;

static bool gz_pump(gz_out_t *g, int flush) {
  int rc;
  do {
    g->z.next_out = g->out;
    g->z.avail_out = (uInt)g->out_cap;
    rc = lib.deflate(&g->z, flush);
    if (rc == Z_STREAM_ERROR) return g->ok = false;
    size_t have = g->out_cap - g->z.avail_out;
    if (have && !os_file_write(g->fd, g->out, have)) return g->ok = false;
  } while (g->z.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
  return true;
}

static void gz_append(ProtobufCBuffer *buffer, size_t len, const uint8_t *data) {
  gz_out_t *g = (gz_out_t *)buffer;
  if (!g->ok) return;
  g->z.next_in = (Bytef *)(uintptr_t)data;
  g->z.avail_in = (uInt)len;
  gz_pump(g, Z_NO_FLUSH);
}

static voidpf gz_alloc(voidpf opaque, uInt items, uInt size) {
  return scratch_alloc(opaque, (size_t)items * size);
}
static void gz_free(voidpf opaque, voidpf p) { (void)opaque, (void)p; }

/* One profile of every stack's totals, written to path. 0, or -1 with errno set. */
static int write_profile(const char *path) {
  if (lib.pack == NULL) {
    errno = ELIBACC; /* zlib or protobuf-c could not be loaded: said once, at start */
    return -1;
  }
  profile_peak_snapshot(true);
  size_t stacks = 0, frames = 0;
  for (profile_stack_t *s = profile_stacks(); s; s = s->all_next) stacks++, frames += s->depth;
  builder_t b;
  if (!builder_init(&b, stacks, frames)) {
    if (b.sc.base) os_unmap(b.sc.base, b.sc.cap);
    errno = ENOMEM;
    return -1;
  }
  Perftools__Profiles__Profile prof;
  perftools__profiles__profile__init(&prof);
  Perftools__Profiles__ValueType *types = scratch_alloc(&b.sc, N_TYPES * sizeof *types);
  Perftools__Profiles__ValueType **type_list = scratch_alloc(&b.sc, N_TYPES * sizeof *type_list);
  Perftools__Profiles__Sample **samples = scratch_alloc(&b.sc, (stacks + 1) * sizeof *samples);
  int rc = -1;
  errno = ENOMEM;
  if (types == NULL || type_list == NULL || samples == NULL) goto out;
  for (size_t i = 0; i < N_TYPES; i++) {
    perftools__profiles__value_type__init(&types[i]);
    types[i].type = string_id(&b.sc, &b.str, type_names[i][0]);
    types[i].unit = string_id(&b.sc, &b.str, type_names[i][1]);
    type_list[i] = &types[i];
  }
  prof.sample_type = type_list;
  prof.n_sample_type = N_TYPES;
  add_mappings(&b);
  size_t n = 0;
  for (profile_stack_t *s = profile_stacks(); s; s = s->all_next) {
    int64_t v[N_TYPES];
    stack_values(s, v);
    bool any = false;
    for (size_t i = 0; i < N_TYPES; i++) any |= v[i] != 0;
    if (!any) continue;
    Perftools__Profiles__Sample *sample = scratch_alloc(&b.sc, sizeof *sample);
    int64_t *values = scratch_alloc(&b.sc, sizeof v);
    uint64_t *locs = scratch_alloc(&b.sc, (s->depth + 1) * sizeof *locs);
    if (sample == NULL || values == NULL || locs == NULL) goto out;
    perftools__profiles__sample__init(sample);
    memcpy(values, v, sizeof v);
    sample->value = values;
    sample->n_value = N_TYPES;
    size_t k = 0;
    for (uint32_t f = 0; f < s->depth; f++) {
      uint64_t id = location_of(&b, s->pc[f]);
      if (id) locs[k++] = id;
    }
    sample->location_id = locs;
    sample->n_location_id = k;
    samples[n++] = sample;
  }
  prof.sample = samples;
  prof.n_sample = n;
  prof.location = b.loc;
  prof.n_location = b.n_loc;
  prof.function = b.fn;
  prof.n_function = b.n_fn;
  prof.mapping = b.map;
  prof.n_mapping = b.n_map;
  Perftools__Profiles__ValueType period_type;
  perftools__profiles__value_type__init(&period_type);
  period_type.type = string_id(&b.sc, &b.str, "space");
  period_type.unit = string_id(&b.sc, &b.str, "bytes");
  prof.period_type = &period_type;
  prof.period = (int64_t)profile.rate;
  uint64_t now_ns = os_realtime_ns();
  prof.time_nanos = (int64_t)now_ns;
  prof.duration_nanos = (int64_t)(now_ns - profile.start_ns);
  prof.default_sample_type = string_id(&b.sc, &b.str, "inuse_space");
  char note[96];
  int64_t comments[2];
  snprintf(note, sizeof note, "threadheap %d.%d heap profile", TH_VERSION_MAJOR, TH_VERSION_MINOR);
  comments[0] = string_id(&b.sc, &b.str, note);
  snprintf(note, sizeof note, "sampling rate %zu bytes; values are estimates of the true totals", profile.rate);
  comments[1] = string_id(&b.sc, &b.str, note);
  prof.comment = comments;
  prof.n_comment = 2;
  prof.string_table = b.str.text;
  prof.n_string_table = b.str.n;

  gz_out_t g = {.base = {.append = gz_append}, .fd = -1, .ok = true};
  g.out_cap = (size_t)64 << 10;
  g.out = scratch_alloc(&b.sc, g.out_cap);
  g.z.zalloc = gz_alloc;
  g.z.zfree = gz_free;
  g.z.opaque = &b.sc;
  if (g.out == NULL || lib.deflate_init(&g.z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY,
                                        ZLIB_VERSION, (int)sizeof g.z) != Z_OK)
    goto out;
  g.fd = os_file_create(path);
  if (g.fd < 0) {
    int e = errno;
    lib.deflate_end(&g.z);
    errno = e;
    goto out;
  }
  lib.pack(&prof.base, &g.base);
  if (g.ok) gz_pump(&g, Z_FINISH);
  lib.deflate_end(&g.z);
  int e = errno;
  bool closed = os_file_close(g.fd);
  if (g.ok && closed) rc = 0;
  else errno = e ? e : EIO;
out:;
  int saved = errno;
  os_unmap(b.sc.base, b.sc.cap);
  errno = saved;
  return rc;
}

/* ---- when to write */

static _Atomic(int) writing;            /* a profile is being written */
static _Atomic(unsigned) dump_seq;      /* PATH.<n> */
static _Atomic(int) dump_requested;     /* SIGUSR2 arrived */
static _Atomic(uint64_t) next_dump_ms;

/* Take the right to write a profile: one at a time. false when another is being written and !wait. */
static bool write_begin(bool wait) {
  while (atomic_exchange_explicit(&writing, 1, memory_order_acquire)) {
    if (!wait) return false;
    os_sleep_ms(1);
  }
  return true;
}

/* Write the profile to path, then give up the right write_begin took. */
static int write_end(const char *path) {
  profile_enter();
  int rc = write_profile(path);
  int e = errno;
  profile_leave();
  atomic_store_explicit(&writing, 0, memory_order_release);
  errno = e;
  return rc;
}

/* PATH, or PATH.<pid> in a process forked from the one that started profiling, then .<n> if seq. */
static void dump_path(char *out, size_t cap, unsigned seq) {
  long pid = os_process_id();
  int n = pid == profile.pid ? snprintf(out, cap, "%s", th_options.profile_path)
                             : snprintf(out, cap, "%s.%ld", th_options.profile_path, pid);
  if (seq && n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ".%u", seq);
}

/* The next numbered profile, PATH.<n>; false when another profile is being written: the caller keeps its
 * request for a later slow path (the number is taken only once the profile is written). */
static bool numbered_dump(void) {
  if (!write_begin(false)) return false;
  char path[4096 + 32];
  dump_path(path, sizeof path, atomic_fetch_add_explicit(&dump_seq, 1, memory_order_relaxed) + 1);
  if (write_end(path) != 0) options_verbose("could not write the heap profile %s (errno %d)", path, errno);
  return true;
}

void profile_tick(uint64_t now_ms) {
  if (th_options.profile_path == NULL) return;
  /* Read before the exchange: every thread's slow paths come here, and a write would bounce the line. */
  if (atomic_load_explicit(&dump_requested, memory_order_relaxed) &&
      atomic_exchange_explicit(&dump_requested, 0, memory_order_relaxed) && !numbered_dump())
    atomic_store_explicit(&dump_requested, 1, memory_order_relaxed);
  if (th_options.profile_interval == 0) return;
  uint64_t next = atomic_load_explicit(&next_dump_ms, memory_order_relaxed);
  uint64_t later = now_ms + (uint64_t)th_options.profile_interval * 1000;
  if (next == 0) {
    atomic_compare_exchange_strong_explicit(&next_dump_ms, &next, later, memory_order_relaxed, memory_order_relaxed);
    return;
  }
  if (now_ms < next) return;
  if (!atomic_compare_exchange_strong_explicit(&next_dump_ms, &next, later, memory_order_relaxed,
                                               memory_order_relaxed))
    return; /* another thread writes this one */
  if (!numbered_dump()) atomic_store_explicit(&next_dump_ms, next, memory_order_relaxed); /* still due */
}

static void on_sigusr2(int sig) {
  (void)sig;
  atomic_store_explicit(&dump_requested, 1, memory_order_relaxed); /* written by the next slow path */
}

void profile_signal_init(void) {
  if (th_options.profile_signal && th_options.profile_path && !os_on_sigusr2(on_sigusr2))
    options_verbose("SIGUSR2 has a handler of the program's: THREADHEAP_PROFILE_SIGNAL is ignored");
}

/* A forked child numbers its own profiles (PATH.<pid>.<n>) from 1, on its own clock. */
void profile_write_fork_child(void) {
  atomic_store_explicit(&writing, 0, memory_order_relaxed);
  atomic_store_explicit(&dump_seq, 0, memory_order_relaxed);
  atomic_store_explicit(&dump_requested, 0, memory_order_relaxed);
  atomic_store_explicit(&next_dump_ms, 0, memory_order_relaxed);
}

TH_API int th_profile_dump(const char *path) {
  if (path == NULL || path[0] == '\0') {
    errno = EINVAL;
    return -1;
  }
  if (!th_profile_on) {
    errno = ENOTSUP; /* profiling is off: THREADHEAP_PROFILE or THREADHEAP_LEAKS turns it on */
    return -1;
  }
  write_begin(true);
  return write_end(path);
}

/* ---- the leak report: the sampled blocks still live at exit, by stack, largest first */

static int by_live_bytes(const void *a, const void *b) {
  uint64_t x = atomic_load_explicit(&(*(profile_stack_t *const *)a)->live_bytes, memory_order_relaxed);
  uint64_t y = atomic_load_explicit(&(*(profile_stack_t *const *)b)->live_bytes, memory_order_relaxed);
  return x < y ? 1 : x > y ? -1 : 0;
}

static void human_bytes(char *out, size_t cap, uint64_t n) {
  if (n >= (uint64_t)1 << 30) snprintf(out, cap, "%.1f GiB", (double)n / (1 << 30));
  else if (n >= (uint64_t)1 << 20) snprintf(out, cap, "%.1f MiB", (double)n / (1 << 20));
  else if (n >= (uint64_t)1 << 10) snprintf(out, cap, "%.1f KiB", (double)n / (1 << 10));
  else snprintf(out, cap, "%llu bytes", (unsigned long long)n);
}

/* A frame of the leak report: "#i 0xPC function+0xOFF file:line (object)" (profile_symbols.c). */
static void print_frame(uint32_t i, uintptr_t pc) {
  char what[900], line[1024];
  symbols_describe(pc, what, sizeof what);
  int len = snprintf(line, sizeof line, "    #%u %s\n", i, what);
  os_write_err(line, len > 0 && (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
}

static void leak_report(void) {
  size_t n = 0;
  uint64_t total = 0;
  for (profile_stack_t *s = profile_stacks(); s; s = s->all_next)
    if ((int64_t)atomic_load_explicit(&s->live_bytes, memory_order_relaxed) > 0) n++;
  char line[1024];
  scratch_t sc = {.cap = align_up((n + 1) * sizeof(void *), (size_t)1 << 16)};
  sc.base = os_reserve_rw(sc.cap);
  profile_stack_t **list = sc.base ? scratch_alloc(&sc, n * sizeof *list) : NULL;
  if (list == NULL) return;
  n = 0;
  for (profile_stack_t *s = profile_stacks(); s; s = s->all_next) {
    int64_t live = (int64_t)atomic_load_explicit(&s->live_bytes, memory_order_relaxed);
    if (live > 0) list[n++] = s, total += (uint64_t)live;
  }
  qsort(list, n, sizeof *list, by_live_bytes);
  char size[32];
  human_bytes(size, sizeof size, total);
  int len = snprintf(line, sizeof line, "threadheap: %s estimated still allocated at exit, from %zu call stack%s "
                     "(sampled every %zu bytes on average)\n", size, n, n == 1 ? "" : "s", profile.rate);
  os_write_err(line, (size_t)len);
  for (size_t i = 0; i < n; i++) {
    profile_stack_t *s = list[i];
    human_bytes(size, sizeof size, atomic_load_explicit(&s->live_bytes, memory_order_relaxed));
    uint64_t count = (atomic_load_explicit(&s->live_count, memory_order_relaxed) + PROFILE_COUNT_ONE / 2) /
                     PROFILE_COUNT_ONE;
    len = snprintf(line, sizeof line, "threadheap: leak of ~%s in ~%llu block%s, allocated at:\n", size,
                   (unsigned long long)count, count == 1 ? "" : "s");
    os_write_err(line, (size_t)len);
    for (uint32_t f = 0; f < s->depth; f++) print_frame(f, s->pc[f]);
  }
  os_unmap(sc.base, sc.cap);
}

void profile_done(void) {
  if (!th_profile_on) return;
  if (th_options.profile_path && lib.pack != NULL) { /* without zlib or protobuf-c: said at start */
    char path[4096 + 32];
    dump_path(path, sizeof path, 0);
    write_begin(true);
    if (write_end(path) != 0) {
      char line[256];
      int n = snprintf(line, sizeof line, "threadheap: could not write the heap profile %s: %s\n", path,
                       strerror(errno));
      os_write_err(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    }
  }
  if (th_options.leaks) {
    profile_enter();
    symbols_open();
    leak_report();
    symbols_close();
    profile_leave();
  }
}
