"""Another local user attacking a job's /dev/shm segments (tests/test_shm_security.py runs it as
uid nobody, with the system python: standard library only).

argv: the path of a file of root's that a symbolic link should make the job overwrite, then a JSON
list of [name, "file" | "symlink"] to plant in /dev/shm before the job starts. Until a line arrives
on stdin it watches the listing and, for every new tfcl_* name: opens it for reading and writing
(and, if that worked, reads it and writes a control segment's worst: negative row counts, every
flag set), tries to unlink and rename it, and plants what it can derive from the name (the old
scheme's .ctl/_probe/_<set>_<key>.ctl names, neighbouring names) as mode-0666 files full of that
garbage and as symbolic links to root's file. Then it removes what it planted and prints a JSON
report on stdout.
"""
import json
import os
import re
import select
import struct
import sys

SHM = "/dev/shm"
GARBAGE = struct.pack("<q", -5) * 1089   # the size of a control segment, every field -5 (flags set)
victim, planted_first = sys.argv[1], json.loads(sys.argv[2])
report = {"seen": {}, "opened": [], "read": [], "written": [], "unlinked": [], "planted": 0, "uid": os.getuid()}
planted = []


def plant(name, kind):
    path = os.path.join(SHM, name)
    try:
        if kind == "symlink":
            os.symlink(victim, path)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            os.fchmod(fd, 0o666)
            os.write(fd, GARBAGE)
            os.close(fd)
    except OSError:
        return
    planted.append(path)
    report["planted"] += 1


def derived(name):
    """What an attacker may guess from a name it sees: the old naming scheme and neighbours."""
    token = name[5:]
    last = format((int(token[-1], 16) + 1) % 16, "x")
    guesses = [name + ".ctl", name + "_probe", name[:-1] + last, name + ".e0.rs8", name + ".e0.ag4096"]
    guesses += [f"tfcl_{token[:12]}_{s}_{key}.ctl" for s in range(3) for key in ("rs", "ag")]
    return guesses


def attack(name):
    path = os.path.join(SHM, name)
    try:
        report["seen"][name] = os.lstat(path).st_uid
    except OSError:
        return
    for flags in (os.O_RDONLY, os.O_RDWR):
        try:
            fd = os.open(path, flags | os.O_NONBLOCK)
        except OSError:
            continue
        report["opened"].append(name)
        try:
            if os.read(fd, 64):
                report["read"].append(name)
            if flags == os.O_RDWR and os.pwrite(fd, GARBAGE, 0):
                report["written"].append(name)
        except OSError:
            pass
        os.close(fd)
    for remove in (lambda: os.unlink(path), lambda: os.rename(path, path + "_moved")):
        try:
            remove()
            report["unlinked"].append(name)
        except OSError:
            pass
    for i, guess in enumerate(derived(name)):
        plant(guess, "symlink" if i % 2 else "file")


for name, kind in planted_first:
    plant(name, kind)
print("ready", flush=True)
mine = set(os.path.basename(p) for p in planted)
while not select.select([sys.stdin], [], [], 0.002)[0]:
    for name in os.listdir(SHM):
        if re.fullmatch(r"tfcl_[0-9a-f]{32}", name) and name not in report["seen"] and name not in mine:
            attack(name)
            mine = set(os.path.basename(p) for p in planted)
for path in planted:
    try:
        os.unlink(path)
    except OSError:
        pass
print(json.dumps(report), flush=True)
