// prog_profile_cpp.cpp: a C++ program whose leak report must name leaky_new (operator new), not tidy_new.
#include <cstring>
#include <vector>

static std::vector<char *> *kept = new std::vector<char *>();

__attribute__((noipa)) void leaky_new() {
  for (int i = 0; i < 384; i++) {
    char *p = new char[64 << 10];
    std::memset(p, 1, 64 << 10);
    kept->push_back(p);
  }
}

__attribute__((noipa)) void tidy_new() {
  for (int i = 0; i < 1024; i++) {
    char *p = new char[64 << 10];
    std::memset(p, 1, 64 << 10);
    delete[] p;
  }
}

int main() {
  kept->reserve(1024);
  leaky_new();
  tidy_new();
  return 0;
}
