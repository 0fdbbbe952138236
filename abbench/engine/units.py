"""Units the engine counts in, defined once (every module that turns bytes into MiB
imports them from here, never from another module of the engine)."""

MIB = 1 << 20  # bytes in a MiB
