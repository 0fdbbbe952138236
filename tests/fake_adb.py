"""An `adb` client for one device that is this machine, for the adb fault tests: what it
does on the device it does in this machine's `sh`, each shell command in a session of its
own (as adbd starts it), and what it prints when the device is not there is what the real
client prints — captured by running Debian's adb 29.0.6 (`apt-get install adb`) against a
serial no device answers to:

    $ adb -s R5CT1234567 get-state     -> "error: device 'R5CT1234567' not found", exit 1
    $ adb -s R5CT1234567 shell true    -> the same, exit 1
    $ adb -s R5CT1234567 push A B      -> "adb: error: failed to get feature set: device
                                           'R5CT1234567' not found", exit 1

State, in the folder `$FAKE_ADB_STATE`: `gone` (the device is unplugged: every command
fails as above; a shell in flight loses its connection — its client exits 1, its command
keeps running on the device, as a USB cable pulled mid-command leaves it), `calls.jsonl`
(every call's arguments). What the real client prints when a shell loses its device
mid-command is not reproduced (no device here to pull): this one prints
"error: device offline" — abbench reads only the exit status there, then `get-state`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def gone(state: Path) -> bool:
    return (state / "gone").exists()


def main(argv: list[str]) -> int:
    state = Path(os.environ["FAKE_ADB_STATE"])
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\n")
    if argv[:1] != ["-s"] or len(argv) < 3:
        sys.stderr.write("adb: usage: unknown command\n")
        return 1
    serial, verb, rest = argv[1], argv[2], argv[3:]
    if gone(state):
        prefix = "adb: error: failed to get feature set: " if verb == "push" else "error: "
        sys.stderr.write(f"{prefix}device '{serial}' not found\n")
        return 1
    if verb == "get-state":
        print("device")
        return 0
    if verb == "push":
        shutil.copyfile(rest[0], rest[1])
        return 0
    if verb != "shell":
        sys.stderr.write(f"adb: unknown command {verb}\n")
        return 1
    child = subprocess.Popen(["sh", "-c", " ".join(rest)], start_new_session=True)
    while child.poll() is None:
        if gone(state):  # the cable pulled: the client is cut off, the command runs on
            sys.stderr.write("error: device offline\n")
            return 1
        time.sleep(0.1)
    return child.returncode


def install(folder: Path) -> tuple[Path, Path]:
    """`adb` in `folder/bin` running this fake, and its state folder."""
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    (folder / "state").mkdir(exist_ok=True)
    adb = folder / "bin" / "adb"
    adb.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    adb.chmod(0o755)
    return folder / "bin", folder / "state"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
