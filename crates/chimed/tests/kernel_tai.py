"""The kernel's TAI - UTC offset, as chronyd sets it with `leapsectz` (adjtimex(2), ADJ_TAI):
prints it; with a value, sets it first (needs CAP_SYS_TIME). Exits non-zero on any error.
Usage: kernel_tai.py [SECONDS]"""
import ctypes
import sys

ADJ_TAI = 0x0080


class Timex(ctypes.Structure):
    """struct timex of <sys/timex.h> on Linux (64-bit longs)."""
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long),
                ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
                ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long),
                ("tai", ctypes.c_int), ("reserved", ctypes.c_int * 11)]


libc = ctypes.CDLL(None, use_errno=True)


def adjtimex(t):
    if libc.adjtimex(ctypes.byref(t)) < 0:
        sys.exit(f"adjtimex: errno {ctypes.get_errno()}")


if len(sys.argv) > 1:
    adjtimex(Timex(modes=ADJ_TAI, constant=int(sys.argv[1])))
t = Timex()
adjtimex(t)
print(t.tai)
