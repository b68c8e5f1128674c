# install.cmake -- what `cmake --install` puts down: the kvsieve command line
# and libkvsieve.so (the C ABI), component "runtime"; nothing else (no static
# libraries, no tests, no headers).
#
# Under scikit-build-core (`pip install .`, pyproject.toml; SKBUILD is set)
# both go into the Python package's folder of the wheel, where the binding
# looks first (python/kvsieve/_lib.py) and the launcher execs the binary
# (python/kvsieve/_cli.py):
#   kvsieve/bin/kvsieve
#   kvsieve/libkvsieve.so.1       (the SONAME; one file, no symlinks)
# A plain `cmake --install build --prefix P` gives P/bin/kvsieve and
# P/lib/libkvsieve.so.1.x.y with its SONAME link.
#
# Nothing else is needed at run time: the haystack text (datasets/data) and
# the model registry (scripts/models.tsv) are compiled into the binary, and
# experiments/*.lua are configs the user names on the command line.
if(SKBUILD)
  set(_kvs_bin_dir ${SKBUILD_PROJECT_NAME}/bin)
  set(_kvs_lib_dir ${SKBUILD_PROJECT_NAME})
else()
  include(GNUInstallDirs)
  set(_kvs_bin_dir ${CMAKE_INSTALL_BINDIR})
  set(_kvs_lib_dir ${CMAKE_INSTALL_LIBDIR})
endif()

# Keep the link directories outside the system's (Debian's openblas-pthread,
# the CUDA toolkit's lib64) in the installed RUNPATH, as in the build tree.
set_target_properties(kvsieve kvsieve_abi PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

install(TARGETS kvsieve RUNTIME DESTINATION ${_kvs_bin_dir} COMPONENT runtime)
install(TARGETS kvsieve_abi LIBRARY DESTINATION ${_kvs_lib_dir} NAMELINK_SKIP COMPONENT runtime)
if(SKBUILD)
  # A wheel holds no symlinks (each would become a second copy of the
  # library): keep the real file, under its SONAME, only.
  install(CODE "
    set(_kvs_d \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${_kvs_lib_dir}\")
    file(REMOVE \"\${_kvs_d}/$<TARGET_SONAME_FILE_NAME:kvsieve_abi>\")
    file(RENAME \"\${_kvs_d}/$<TARGET_FILE_NAME:kvsieve_abi>\" \"\${_kvs_d}/$<TARGET_SONAME_FILE_NAME:kvsieve_abi>\")
    message(STATUS \"Renamed: \${_kvs_d}/$<TARGET_FILE_NAME:kvsieve_abi> -> $<TARGET_SONAME_FILE_NAME:kvsieve_abi>\")"
    COMPONENT runtime)
endif()
