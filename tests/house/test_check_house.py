#!/usr/bin/env python3
"""Self-test of scripts/check_house.py: a made-up tree where a.c calls b.c and b.c calls
a.c, c.c includes a.h (a's interface), and one file is too long, must be refused with each
problem named; the same tree without them must pass.
usage: test_check_house.py CHECK_HOUSE_PY CC"""
import os, subprocess, sys, tempfile

def build(root, files):
    for name, text in files.items():
        p = os.path.join(root, "src", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    obj = os.path.join(root, "build", "src", "CMakeFiles", "t.dir")
    os.makedirs(obj, exist_ok=True)
    for name in files:
        if name.endswith(".c"):
            subprocess.run([CC, "-c", "-I", os.path.join(root, "src"), os.path.join(root, "src", name),
                            "-o", os.path.join(obj, name + ".o")], check=True)

def check(root):
    r = subprocess.run([sys.executable, CHECK, root, os.path.join(root, "build")],
                       capture_output=True, text=True)
    return r.returncode, r.stdout

CHECK, CC = sys.argv[1], sys.argv[2]
ok = True
with tempfile.TemporaryDirectory() as bad:
    build(bad, {"a.h": "int a(int);\n",
                "a.c": "int b(int);\nint a(int x) { return x ? b(x - 1) : 0; }\n",
                "b.c": "int a(int);\nint b(int x) { return a(x); }\n",
                "c.h": "int c(void);\n",
                "c.c": '#include "a.h"\nint c(void) { return 1; }\n' + "\n" * 1200,
                "d.c": '#include "c.h"\nint d(void) { return c(); }\n'})
    rc, out = check(bad)
    for want in ("circle between files (calls): src/a.c <-> src/b.c", "long file: src/c.c"):
        if want not in out:
            print(f"FAIL: expected '{want}' in:\n{out}"); ok = False
    if rc != 1:
        print(f"FAIL: exit {rc} for a tree with problems"); ok = False
with tempfile.TemporaryDirectory() as good:
    build(good, {"a.h": "int a(int);\n", "a.c": "int a(int x) { return x; }\n",
                 "b.c": '#include "a.h"\nint b(int x) { return a(x); }\n'})
    rc, out = check(good)
    if rc != 0:
        print(f"FAIL: exit {rc} for a clean tree:\n{out}"); ok = False
print("house_rules_selftest:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
