"""_cli.py -- the `kvsieve` command of an installed wheel: execs the C
binary shipped inside the package (kvsieve/bin/kvsieve, put there by
cmake/install.cmake), passing the arguments through."""
import os
import sys


def binary():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kvsieve")


def main():
    exe = binary()
    if not os.access(exe, os.X_OK):
        sys.stderr.write("kvsieve: %s is missing; this kvsieve package was not installed from the wheel "
                         "(pip install .), in a checkout run build/kvsieve\n" % exe)
        return 127
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
