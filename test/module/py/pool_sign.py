"""A multiprocessing pool of 8 processes, forked from a parent that loaded
libhapkcs11.so and initialised it, each signing through its own
C_Initialize; the parent verifies every signature with the public key.

    pool_sign.py MODULE TOKEN_LABEL KEY_LABEL PIN_FILE COUNT

Prints "signed N verified N by P processes" and exits 0 when every
signature verifies.
"""
import multiprocessing
import os
import sys

import PyKCS11

MODULE, TOKEN, KEY, PIN_FILE, COUNT = sys.argv[1:6]
COUNT = int(COUNT)


def pin():
    with open(PIN_FILE) as f:
        return f.readline().strip()


def open_session(lib):
    for slot in lib.getSlotList(tokenPresent=True):
        if lib.getTokenInfo(slot).label.strip() == TOKEN:
            s = lib.openSession(slot)
            s.login(pin())
            return s
    raise SystemExit("no token labelled " + TOKEN)


def key(session, cls):
    objs = session.findObjects([(PyKCS11.CKA_CLASS, cls), (PyKCS11.CKA_LABEL, KEY)])
    if len(objs) != 1:
        raise SystemExit("found %d keys labelled %s" % (len(objs), KEY))
    return objs[0]


worker = {}


def start_worker():
    # A new PKCS#11 application: its own C_Initialize (load() calls it).
    lib = PyKCS11.PyKCS11Lib()
    lib.load(MODULE)
    s = open_session(lib)
    worker.update(lib=lib, session=s, key=key(s, PyKCS11.CKO_PRIVATE_KEY))


def sign(i):
    data = bytes([i % 256]) * 32
    sig = worker["session"].sign(worker["key"], data, PyKCS11.Mechanism(PyKCS11.CKM_ECDSA, None))
    return os.getpid(), data, bytes(sig)


def main():
    lib = PyKCS11.PyKCS11Lib()
    lib.load(MODULE)
    s = open_session(lib)
    pub = key(s, PyKCS11.CKO_PUBLIC_KEY)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8, initializer=start_worker) as pool:
        results = pool.map(sign, range(COUNT), chunksize=4)
    verified = 0
    for _, data, sig in results:
        if s.verify(pub, data, sig, PyKCS11.Mechanism(PyKCS11.CKM_ECDSA, None)):
            verified += 1
    procs = len({pid for pid, _, _ in results})
    print("signed %d verified %d by %d processes" % (len(results), verified, procs))
    s.logout()
    s.closeSession()
    return 0 if verified == COUNT == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
