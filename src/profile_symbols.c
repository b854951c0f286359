/* profile_symbols.c: the names of the leak report's frames, "function+0xOFF file:line (object)".
 *
 * elfutils' libdw reads the symbol tables and the DWARF line tables of the objects mapped in this process
 * (a program built with -g gets file:line; the full .symtab names static functions that dladdr, which reads
 * only the dynamic symbols, would miss). It is opened with dlopen when the report is printed, at exit, so a
 * process that never asks for the report does not load it, and a machine without libdw1 still gets function
 * names from dladdr. Separate debug files are looked up under /usr/lib/debug only: never from the network
 * (debuginfod), at exit, whatever DEBUGINFOD_URLS says.
 *
 * libdw allocates with malloc: the report runs inside profile_enter, so nothing of it is sampled. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "os.h"
#include "profile.h"

/* The functions of libdw the report uses, found by dlsym; typed by libdw's own header. */
static struct {
  void *lib;
  Dwfl *dwfl;
  __typeof__(dwfl_begin) *begin;
  __typeof__(dwfl_end) *end;
  __typeof__(dwfl_report_begin) *report_begin;
  __typeof__(dwfl_report_end) *report_end;
  __typeof__(dwfl_linux_proc_report) *proc_report;
  __typeof__(dwfl_linux_proc_find_elf) *proc_find_elf;
  __typeof__(dwfl_build_id_find_debuginfo) *build_id_find_debuginfo;
  __typeof__(dwfl_addrmodule) *addrmodule;
  __typeof__(dwfl_module_addrinfo) *addrinfo;
  __typeof__(dwfl_module_getsrc) *getsrc;
  __typeof__(dwfl_lineinfo) *lineinfo;
} dw;

/* Separate debug information by build id under /usr/lib/debug, and nothing else. */
static int find_debuginfo(Dwfl_Module *mod, void **user, const char *name, Dwarf_Addr base, const char *file,
                          const char *debuglink, GElf_Word crc, char **found) {
  return dw.build_id_find_debuginfo(mod, user, name, base, file, debuglink, crc, found);
}

static char *debuginfo_path;
static Dwfl_Callbacks callbacks = {.find_debuginfo = find_debuginfo, .debuginfo_path = &debuginfo_path};

#define DW_SYMBOL(field, name) (dw.field = (__typeof__(dw.field))dlsym(dw.lib, name)) != NULL

void symbols_open(void) {
  dw.lib = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (dw.lib == NULL) return;
  if (DW_SYMBOL(begin, "dwfl_begin") && DW_SYMBOL(end, "dwfl_end") &&
      DW_SYMBOL(report_begin, "dwfl_report_begin") && DW_SYMBOL(report_end, "dwfl_report_end") &&
      DW_SYMBOL(proc_report, "dwfl_linux_proc_report") && DW_SYMBOL(proc_find_elf, "dwfl_linux_proc_find_elf") &&
      DW_SYMBOL(build_id_find_debuginfo, "dwfl_build_id_find_debuginfo") &&
      DW_SYMBOL(addrmodule, "dwfl_addrmodule") && DW_SYMBOL(addrinfo, "dwfl_module_addrinfo") &&
      DW_SYMBOL(getsrc, "dwfl_module_getsrc") && DW_SYMBOL(lineinfo, "dwfl_lineinfo")) {
    callbacks.find_elf = dw.proc_find_elf; /* the objects of /proc/self/maps, opened by path */
    dw.dwfl = dw.begin(&callbacks);
    if (dw.dwfl != NULL) {
      dw.report_begin(dw.dwfl);
      if (dw.proc_report(dw.dwfl, getpid()) == 0 && dw.report_end(dw.dwfl, NULL, NULL) == 0) return;
      dw.end(dw.dwfl);
      dw.dwfl = NULL;
    }
  }
  dlclose(dw.lib);
  dw.lib = NULL;
}

void symbols_close(void) {
  if (dw.dwfl != NULL) dw.end(dw.dwfl);
  if (dw.lib != NULL) dlclose(dw.lib);
  dw.dwfl = NULL;
  dw.lib = NULL;
}

/* The C++ runtime's demangler, when the program has it loaded (weak: a C program does not). */
extern char *__cxa_demangle(const char *mangled, char *out, size_t *len, int *status) __attribute__((weak));

/* "function+0xOFF file:line (object)" for the call site pc, with what is known of it: at least the address. */
void symbols_describe(uintptr_t pc, char *out, size_t cap) {
  const char *name = NULL, *object = NULL, *file = NULL;
  uintptr_t offset = 0, object_offset = 0;
  int line = 0;
  Dwfl_Module *mod = dw.dwfl ? dw.addrmodule(dw.dwfl, pc) : NULL;
  if (mod != NULL) {
    GElf_Off off = 0;
    GElf_Sym sym;
    name = dw.addrinfo(mod, pc, &off, &sym, NULL, NULL, NULL);
    offset = (uintptr_t)off;
    Dwfl_Line *l = dw.getsrc(mod, pc);
    if (l != NULL) file = dw.lineinfo(l, NULL, &line, NULL, NULL, NULL);
  }
  Dl_info info;
  if (dladdr((void *)pc, &info) != 0 && info.dli_fname != NULL) {
    object = info.dli_fname;
    object_offset = pc - (uintptr_t)info.dli_fbase;
    if (name == NULL && info.dli_sname != NULL) name = info.dli_sname, offset = pc - (uintptr_t)info.dli_saddr;
  }
  char plain[256]; /* the name without its symbol version ("__libc_start_main@@GLIBC_2.34") */
  if (name != NULL && strchr(name, '@') != NULL) {
    snprintf(plain, sizeof plain, "%.*s", (int)(strchr(name, '@') - name), name);
    name = plain;
  }
  char *demangled = name && __cxa_demangle ? __cxa_demangle(name, NULL, NULL, NULL) : NULL;
  char where[512] = "";
  if (file != NULL && line > 0) snprintf(where, sizeof where, " %s:%d", file, line);
  if (name != NULL)
    snprintf(out, cap, "0x%lx %s+0x%lx%s (%s)", (unsigned long)pc, demangled ? demangled : name,
             (unsigned long)offset, where, object ? object : "?");
  else if (object != NULL)
    snprintf(out, cap, "0x%lx (%s+0x%lx)%s", (unsigned long)pc, object, (unsigned long)object_offset, where);
  else
    snprintf(out, cap, "0x%lx", (unsigned long)pc);
  free(demangled);
}
