# What `cmake --install` puts in place: the shared and static library, the public headers, a pkg-config file,
# a CMake package (find_package(threadheap) -> threadheap::threadheap), the `threadheap` command, which
# is the Python package under share/threadheap/python plus a launcher in bin/ that finds the installed
# library, and its manual page. Every generated path is relative to the file that holds it, so `--prefix` at
# install time and a moved tree both work.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The static library is exported as threadheap::threadheap_archive; threadheapConfig.cmake wraps it in
# threadheap::threadheap_static, which links it whole (see the README: every standard name must come from it).
set_target_properties(threadheap_static PROPERTIES EXPORT_NAME threadheap_archive)
install(TARGETS threadheap threadheap_static EXPORT threadheapTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# A pattern is matched at install time, so threadheap.hpp is installed when it exists.
install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "threadheap.h" PATTERN "threadheap.hpp")

set(TH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/threadheap)
install(EXPORT threadheapTargets NAMESPACE threadheap:: DESTINATION ${TH_CMAKE_DIR})
configure_file(cmake/threadheapConfig.cmake.in ${CMAKE_BINARY_DIR}/threadheapConfig.cmake @ONLY)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/threadheapConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/threadheapConfig.cmake ${CMAKE_BINARY_DIR}/threadheapConfigVersion.cmake
  DESTINATION ${TH_CMAKE_DIR})

# Relative paths from the pkg-config folder and from bin/ back to the prefix ("/p" stands for any prefix).
file(RELATIVE_PATH TH_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
file(RELATIVE_PATH TH_BIN_TO_PREFIX /p/${CMAKE_INSTALL_BINDIR} /p)
string(REGEX REPLACE "/$" "" TH_PC_TO_PREFIX "${TH_PC_TO_PREFIX}")
string(REGEX REPLACE "/$" "" TH_BIN_TO_PREFIX "${TH_BIN_TO_PREFIX}")
configure_file(cmake/threadheap.pc.in ${CMAKE_BINARY_DIR}/threadheap.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/threadheap.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

set(TH_INSTALL_PYDIR ${CMAKE_INSTALL_DATADIR}/threadheap/python)
install(DIRECTORY python/threadheap DESTINATION ${TH_INSTALL_PYDIR} PATTERN __pycache__ EXCLUDE)
# The profile schema the profile reader compiles on first use (python/threadheap/profile_read.py).
install(FILES proto/profile.proto DESTINATION ${CMAKE_INSTALL_DATADIR}/threadheap/proto)
# The touch workload, which `threadheap run --stats` runs once to price a page fault on the machine.
if(TARGET touch)
  install(TARGETS touch RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/threadheap)
endif()
# The Python the installed command runs: python3 from PATH, or a fixed one (`make deb`: Debian's
# /usr/bin/python3, the one that sees the python3-* packages the .deb recommends).
set(TH_INSTALL_PYTHON python3 CACHE STRING "the Python that the installed threadheap command runs")
configure_file(cmake/threadheap-launcher.in ${CMAKE_BINARY_DIR}/threadheap-launcher @ONLY)
install(PROGRAMS ${CMAKE_BINARY_DIR}/threadheap-launcher DESTINATION ${CMAKE_INSTALL_BINDIR}
  RENAME threadheap)

# `man threadheap`: the page gets the version from here, and is installed gzipped, as Debian's policy has it.
configure_file(man/threadheap.1.in ${CMAKE_BINARY_DIR}/threadheap.1 @ONLY)
find_program(TH_GZIP gzip REQUIRED)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/threadheap.1.gz
  COMMAND ${TH_GZIP} -9 -n -k -f ${CMAKE_BINARY_DIR}/threadheap.1
  DEPENDS ${CMAKE_BINARY_DIR}/threadheap.1 VERBATIM)
add_custom_target(man ALL DEPENDS ${CMAKE_BINARY_DIR}/threadheap.1.gz)
install(FILES ${CMAKE_BINARY_DIR}/threadheap.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
