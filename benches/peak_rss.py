"""Python source of the resident-memory helpers for the child processes of the memory benchmarks (Linux).

``PRELUDE`` defines ``rss(field)`` (a ``/proc/self/status`` field such as ``"VmRSS:"`` or ``"VmHWM:"``, in bytes)
and ``reset_peak()`` (resets ``VmHWM`` through ``/proc/self/clear_refs``); a benchmark's child code starts with it.
"""

PRELUDE = r"""
def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""
