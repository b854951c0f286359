// worker_pool: a server-style pool of worker threads. Each request gets a private heap: everything the
// request builds (its tokens, a word-count table, the strings in both) lives in that heap, and when the
// request is done the heap is destroyed in one call: no destructor runs, no block is freed one by one, and
// no worker ever waits for another's allocator lock. This is the busy-server case of the thread-private
// heaps article (seed 002), on Linux.
//
//   worker_pool [workers] [requests]      defaults: 4 workers, 400 requests
#include <cstdio>
#include <cstdlib>
#include <memory_resource>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "threadheap.hpp"

namespace {

// A request: a document made of words, generated from its number so that the run needs no input.
std::string make_document(int id) {
  static const char *const words[] = {"heap", "thread", "lock", "page", "segment", "block", "free",
                                      "alloc", "cache", "server", "request", "private"};
  std::string doc;
  unsigned x = 2654435761u * static_cast<unsigned>(id + 1);
  for (int i = 0; i < 2000; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    doc += words[x % 12];
    doc += ' ';
  }
  return doc;
}

struct Answer {
  std::string top_word;
  long top_count = 0;
  long words = 0;
};

// Handles one request. Every allocation below goes to `arena`, which is destroyed at the closing brace.
Answer handle(const std::string &document) {
  // Only this thread allocates from the heap: no lock, no atomic instruction. 256 KiB are committed up
  // front, so a typical request takes no page fault either.
  th::heap arena(TH_HEAP_NO_SERIALIZE, 256 * 1024);
  th::memory_resource res(arena);

  using Tokens = std::pmr::vector<std::pmr::string>;
  using Counts = std::pmr::unordered_map<std::pmr::string, long>;
  // Made in the heap and never destroyed: the heap takes them with it.
  Tokens *tokens = arena.make<Tokens>(&res);
  Counts *counts = arena.make<Counts>(&res);

  std::string_view rest(document);
  while (!rest.empty()) {
    size_t space = rest.find(' ');
    std::string_view word = rest.substr(0, space);
    if (!word.empty()) tokens->emplace_back(word);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  }
  for (const auto &t : *tokens) ++(*counts)[t];

  Answer a;
  a.words = static_cast<long>(tokens->size());
  for (const auto &[word, n] : *counts)
    if (n > a.top_count || (n == a.top_count && std::string_view(word) < std::string_view(a.top_word))) {
      a.top_count = n;
      a.top_word.assign(word.data(), word.size());  // the answer leaves the heap as an ordinary string
    }
  return a;
}

}  // namespace

int main(int argc, char **argv) {
  int workers = argc > 1 ? std::atoi(argv[1]) : 4;
  int requests = argc > 2 ? std::atoi(argv[2]) : 400;
  if (workers < 1 || requests < 1) {
    std::fprintf(stderr, "usage: worker_pool [workers] [requests]\n");
    return 2;
  }

  std::mutex lock;
  int next = 0;
  long total_words = 0;
  std::unordered_map<std::string, int> winners;  // which word topped how many requests
  th_stats_t before;
  th_stats_get(&before);

  std::vector<std::thread> pool;
  for (int w = 0; w < workers; w++)
    pool.emplace_back([&] {
      for (;;) {
        int id;
        {
          std::lock_guard<std::mutex> g(lock);
          if (next == requests) return;
          id = next++;
        }
        Answer a = handle(make_document(id));
        std::lock_guard<std::mutex> g(lock);
        total_words += a.words;
        winners[a.top_word]++;
      }
    });
  for (auto &t : pool) t.join();

  th_stats_t after;
  th_stats_get(&after);
  std::string best;
  int best_n = 0;
  for (const auto &[word, n] : winners)
    if (n > best_n || (n == best_n && word < best)) best = word, best_n = n;
  std::printf("worker_pool: %d requests on %d workers, %ld words, %zu private heaps created and destroyed\n",
              requests, workers, total_words, after.heaps_created - before.heaps_created);
  std::printf("worker_pool: \"%s\" was the most frequent word in %d of %d requests\n", best.c_str(), best_n,
              requests);
  bool ok = total_words == 2000L * requests && after.heaps_created - before.heaps_created >= (size_t)requests;
  return ok ? 0 : 1;
}
