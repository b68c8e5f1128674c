# (a package, so that unittest discovery imports the tests as tests.*)
