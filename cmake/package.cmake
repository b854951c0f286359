# The Debian package, threadheap_<version>_<arch>.deb: everything `cmake --install` puts in place, in one
# package. `make deb` builds it from a build folder of its own configured with the prefix /usr, so that the
# libraries land in Debian's multiarch folder (GNUInstallDirs picks lib/<triplet> for /usr only).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME threadheap)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "threadheap maintainers <maintainers@users.noreply.a-seed-0b31f418.example>")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
# The first line is the synopsis; CPack indents the others and turns the empty one into " .".
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "memory allocator for multithreaded programs
threadheap gives every thread a heap of its own, with no lock on the fast path, and replaces malloc, free
and C++'s new and delete process-wide, preloaded or linked. Explicit heaps (th_heap_create) and a C++
layer over them; live statistics, heap profiles in pprof's format, and misuse (double free, invalid
pointers) stopped with one line.

The package holds the shared and static libraries, the headers, threadheap.pc, the CMake package and the
threadheap command (run, top, profile, bench).")
# The libraries the .so and the touch workload link (libc), as dpkg-shlibdeps finds them; libunwind, zlib and
# protobuf-c, which the library opens with dlopen when profiling starts, named here; the command is Python. Heap profiles are read with protobuf, whose schema Debian's protoc
# compiles on first use, and symbolised with addr2line; bench, --record and --flame draw with matplotlib, and
# bench and top's live view print with rich.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3, libprotobuf-c1, zlib1g, libunwind8")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-protobuf, protobuf-compiler, binutils")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
  "python3-rich, python3-matplotlib, libprotobuf-c-dev, zlib1g-dev, libunwind-dev, pkg-config, cmake")
# A shlibs file for packages built against this one, and the ldconfig trigger for the new library.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# Python writes __pycache__ beside the modules when root runs the command. dpkg does not know those files, so
# the prerm removes them; else removing the package would leave the folder behind.
file(WRITE ${CMAKE_BINARY_DIR}/debian/prerm "#!/bin/sh\nset -e\nrm -rf \
'${CMAKE_INSTALL_PREFIX}/${TH_INSTALL_PYDIR}/threadheap/__pycache__'\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/debian/prerm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON) # maintainer scripts 0755, the rest 0644
include(CPack)
