// railyard._ringcore: the Python client's end of the session rings (docs/local-api.md, "Rings")
// in C++, so that a submission, the wait for its completion and the read of it cost no Python
// bytecode: the hot path of every operation on the rings (railyard/_ring.py keeps a pure-Python
// twin, used where this module was not built or RAILYARD_PY_NATIVE=0).
//
// Concurrency: every method runs with the GIL held and releases it only around system calls
// (futex, sched_yield) and never while it holds ring state half-updated, so the GIL is the lock
// that orders this process's threads (the Python twin's sq/cq locks). Python objects are made
// only after the indices have moved, because making one may run a finalizer that lets another
// thread in. The daemon on the other side is ordered by the atomics below, as in the C++ client
// (client/cpp/client_rings.cc).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "railyard/v1/ring.h"
#include "railyard/v1/ring_futex.h"
#include "railyard/v1/spin_yield.h"

namespace rp = railyard::ringproto;

namespace {

// The longest one futex sleep (a closed session or a deadline is noticed at least this often).
constexpr double kMaxSleepS = 0.1;

// Seconds on time.monotonic()'s clock (CLOCK_MONOTONIC, which spin_yield.h reads).
double Monotonic() { return static_cast<double>(rp::MonotonicNs()) * 1e-9; }

struct Completion {
  uint64_t request_id;
  uint64_t seq;
  int32_t code;
  uint32_t flags;  // rp::kCqFlag* (kCqFlagMoved: handed back untaken, not an outcome)
  std::string message;
};

struct RingCore {
  PyObject_HEAD Py_buffer view;  // the rings' mapping, held for the life of this object
  bool have_view;
  std::byte* base;
  uint32_t sq_entries;
  uint32_t cq_entries;
  uint64_t sq_tail;  // ours: the daemon only reads the shared copy
  uint64_t cq_head;
  double spin_s;
  // How long after a submission or a foreground wait the background reader leaves the completion
  // ring to the submitting thread (railyard/_ring.py, READER_GRACE_S).
  double grace_s;
  PyObject* on_completion;  // on_completion(request_id, code, message, seq, flags)
  bool closed;
  int foreground;           // threads waiting in wait_until
  double foreground_until;  // time.monotonic() until which the reader stays away
};

uint64_t* Word64(RingCore* self, size_t off) {
  return reinterpret_cast<uint64_t*>(self->base + off);
}
uint32_t* Word32(RingCore* self, size_t off) {
  return reinterpret_cast<uint32_t*>(self->base + off);
}

// Wakes the daemon's thread if it sleeps on the submission doorbell. The doorbell's atomic add is
// a full fence on x86-64, so the load of daemon_sleeping after it cannot pass the tail's store
// (the daemon sets the flag, then reads doorbell and tail, before it sleeps).
void RingDoorbell(RingCore* self) {
  __atomic_fetch_add(Word32(self, rp::kOffSqDoorbell), 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(Word32(self, rp::kOffDaemonSleeping), __ATOMIC_SEQ_CST) != 0) {
    uint32_t* word = Word32(self, rp::kOffSqDoorbell);
    Py_BEGIN_ALLOW_THREADS rp::FutexWake(word, 1);
    Py_END_ALLOW_THREADS
  }
}

// The daemon waits for room in the completion ring only while entries wait for it.
void PokeDaemon(RingCore* self) {
  const uint64_t head = __atomic_load_n(Word64(self, rp::kOffSqHead), __ATOMIC_ACQUIRE);
  if (head != self->sq_tail) RingDoorbell(self);
}

// The attribute publish() sets on its owner: the first entry's slot (see RingCore_publish).
PyObject* SlotName() {
  static PyObject* name = PyUnicode_InternFromString("_slot");
  return name;
}

// Reads the completions there are, hands each to on_completion. Returns how many, or -1 with a
// Python exception set (the first a callback raised; every completion read is still handed on).
Py_ssize_t Drain(RingCore* self) {
  if (self->closed) return 0;
  const uint64_t tail = __atomic_load_n(Word64(self, rp::kOffCqTail), __ATOMIC_ACQUIRE);
  if (tail == self->cq_head) return 0;
  std::vector<Completion> got;
  const std::byte* cq = self->base + rp::CqOffset(self->sq_entries);
  while (self->cq_head != tail) {
    const std::byte* e = cq + (self->cq_head & (self->cq_entries - 1)) * rp::kCqEntryBytes;
    Completion c;
    uint32_t len;
    std::memcpy(&c.request_id, e + rp::kCqRequestId, 8);
    std::memcpy(&c.seq, e + rp::kCqSeq, 8);
    std::memcpy(&c.code, e + rp::kCqCode, 4);
    std::memcpy(&len, e + rp::kCqMessageLen, 4);
    std::memcpy(&c.flags, e + rp::kCqFlags, 4);
    if (c.code != 0) {
      if (len > rp::kCqMessageBytes) len = rp::kCqMessageBytes;
      c.message.assign(reinterpret_cast<const char*>(e + rp::kCqMessageOffset), len);
    }
    got.push_back(std::move(c));
    ++self->cq_head;
  }
  __atomic_store_n(Word64(self, rp::kOffCqHead), self->cq_head, __ATOMIC_RELEASE);
  PokeDaemon(self);
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  for (const Completion& c : got) {
    PyObject* message = PyUnicode_DecodeUTF8(c.message.data(),
                                             static_cast<Py_ssize_t>(c.message.size()), "replace");
    PyObject* r = message == nullptr
                      ? nullptr
                      : PyObject_CallFunction(self->on_completion, "KiOKI",
                                              static_cast<unsigned long long>(c.request_id),
                                              static_cast<int>(c.code), message,
                                              static_cast<unsigned long long>(c.seq),
                                              static_cast<unsigned int>(c.flags));
    Py_XDECREF(message);
    if (r == nullptr) {
      if (type == nullptr) {
        PyErr_Fetch(&type, &value, &trace);
      } else {
        PyErr_Clear();
      }
    }
    Py_XDECREF(r);
  }
  if (type != nullptr) {
    PyErr_Restore(type, value, trace);
    return -1;
  }
  return static_cast<Py_ssize_t>(got.size());
}

void FutexWaitNoGil(uint32_t* word, uint32_t expected, double seconds) {
  const int64_t ns = static_cast<int64_t>(seconds * 1e9);
  Py_BEGIN_ALLOW_THREADS rp::FutexWait(word, expected, ns);
  Py_END_ALLOW_THREADS
}

// -1: error (exception set); 0 / 1: done() false / true.
int Done(PyObject* done) {
  PyObject* r = PyObject_CallNoArgs(done);
  if (r == nullptr) return -1;
  const int v = PyObject_IsTrue(r);
  Py_DECREF(r);
  return v;
}

// False, with RuntimeError set, for an object made by RingCore.__new__ alone (no mapping yet).
bool Ready(RingCore* self) {
  if (self->base != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "RingCore is not initialised");
  return false;
}

int RingCore_init(RingCore* self, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"mapping",       "sq_entries", "cq_entries", "spin_us",
                             "on_completion", "grace_s",    nullptr};
  PyObject* mapping;
  unsigned int sq, cq;
  double spin_us;
  PyObject* cb;
  double grace_s;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OIIdOd", const_cast<char**>(kw), &mapping, &sq,
                                   &cq, &spin_us, &cb, &grace_s)) {
    return -1;
  }
  if (!rp::ValidEntries(sq) || !rp::ValidEntries(cq)) {
    PyErr_Format(PyExc_ValueError, "ring entries must be powers of two in [%u, %u]",
                 rp::kMinEntries, rp::kMaxEntries);
    return -1;
  }
  if (!PyCallable_Check(cb)) {
    PyErr_SetString(PyExc_TypeError, "on_completion must be callable");
    return -1;
  }
  if (self->have_view) {
    PyErr_SetString(PyExc_RuntimeError, "RingCore is already initialised");
    return -1;
  }
  if (PyObject_GetBuffer(mapping, &self->view, PyBUF_WRITABLE) != 0) return -1;
  self->have_view = true;
  if (static_cast<uint64_t>(self->view.len) < rp::RingBytes(sq, cq)) {
    PyErr_Format(PyExc_ValueError, "mapping of %zd bytes is smaller than the rings' %llu",
                 self->view.len, static_cast<unsigned long long>(rp::RingBytes(sq, cq)));
    return -1;
  }
  self->base = static_cast<std::byte*>(self->view.buf);
  self->sq_entries = sq;
  self->cq_entries = cq;
  self->spin_s = spin_us / 1e6;
  self->grace_s = grace_s;
  Py_INCREF(cb);
  self->on_completion = cb;
  return 0;
}

void RingCore_dealloc(RingCore* self) {
  if (self->have_view) PyBuffer_Release(&self->view);
  Py_XDECREF(self->on_completion);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);  // a heap type: each instance holds a reference to it
}

// publish(entries, owner=None) -> bool: the whole entries (a multiple of the slot size) at once,
// or False when the submission ring has no room for them now (or the session has ended). owner,
// if given, gets the first entry's slot as owner._slot before the daemon can see the entries: a
// client that reconnects after a crash tells from it, against the daemon's head, whether the
// daemon had taken them (consumed_head), so no entry is ever published without its slot known.
PyObject* RingCore_publish(RingCore* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!Ready(self)) return nullptr;
  if (nargs < 1 || nargs > 2) {
    PyErr_Format(PyExc_TypeError, "publish(entries, owner=None) takes 1 or 2 arguments, not %zd",
                 nargs);
    return nullptr;
  }
  PyObject* owner = nargs == 2 && args[1] != Py_None ? args[1] : nullptr;
  Py_buffer b;
  if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) != 0) return nullptr;
  const size_t len = static_cast<size_t>(b.len);
  if (len == 0 || len % rp::kSqEntryBytes != 0) {
    PyBuffer_Release(&b);
    PyErr_Format(PyExc_ValueError, "entries of %zu bytes are not whole %zu-byte slots", len,
                 rp::kSqEntryBytes);
    return nullptr;
  }
  const uint64_t need = len / rp::kSqEntryBytes;
  const uint64_t head = __atomic_load_n(Word64(self, rp::kOffSqHead), __ATOMIC_ACQUIRE);
  if (self->closed || self->sq_tail + need - head > self->sq_entries) {
    PyBuffer_Release(&b);
    Py_RETURN_FALSE;
  }
  if (owner != nullptr) {
    // An int (no finalizer to run) set on a plain attribute: the GIL stays held from here to the
    // tail's store, so close() cannot come in between.
    PyObject* name = SlotName();
    PyObject* slot = name == nullptr ? nullptr : PyLong_FromUnsignedLongLong(self->sq_tail);
    const int set = slot == nullptr ? -1 : PyObject_SetAttr(owner, name, slot);
    Py_XDECREF(slot);
    if (set != 0) {
      PyBuffer_Release(&b);
      return nullptr;
    }
  }
  std::byte* sq = self->base + rp::SqOffset();
  const auto* src = static_cast<const std::byte*>(b.buf);
  for (uint64_t i = 0; i < need; ++i) {
    std::memcpy(sq + ((self->sq_tail + i) & (self->sq_entries - 1)) * rp::kSqEntryBytes,
                src + i * rp::kSqEntryBytes, rp::kSqEntryBytes);
  }
  PyBuffer_Release(&b);
  self->sq_tail += need;
  __atomic_store_n(Word64(self, rp::kOffSqTail), self->sq_tail, __ATOMIC_RELEASE);
  self->foreground_until = Monotonic() + self->grace_s;
  RingDoorbell(self);
  Py_RETURN_TRUE;
}

PyObject* RingCore_drain(RingCore* self, PyObject*) {
  if (!Ready(self)) return nullptr;
  const Py_ssize_t n = Drain(self);
  if (n < 0) return nullptr;
  return PyLong_FromSsize_t(n);
}

PyObject* RingCore_poke(RingCore* self, PyObject*) {
  if (!Ready(self)) return nullptr;
  PokeDaemon(self);
  Py_RETURN_NONE;
}

// wait_until(done, deadline) -> bool: reads completions on this thread until done() or the
// deadline (time.monotonic(); None: none): spins for spin_us, yielding the CPU (and the GIL)
// every 64 looks, then sleeps on the completion doorbell. Returns done().
PyObject* RingCore_wait_until(RingCore* self, PyObject* args) {
  if (!Ready(self)) return nullptr;
  PyObject* done;
  PyObject* deadline_obj;
  if (!PyArg_ParseTuple(args, "OO", &done, &deadline_obj)) return nullptr;
  double deadline = 0;
  const bool has_deadline = deadline_obj != Py_None;
  if (has_deadline) {
    deadline = PyFloat_AsDouble(deadline_obj);
    if (deadline == -1.0 && PyErr_Occurred()) return nullptr;
  }
  ++self->foreground;
  int result = -1;
  const double spin_end = Monotonic() + self->spin_s;
  bool spinning = true;
  for (uint32_t spins = 0;; ++spins) {
    const int d = Done(done);
    if (d != 0) {
      result = d;
      break;
    }
    if (self->closed) {
      result = Done(done);
      break;
    }
    const Py_ssize_t n = Drain(self);
    if (n < 0) break;
    if (n > 0) continue;
    if (spinning && (spins & 63) != 63) {
      rp::CpuRelax();
      continue;
    }
    const double now = Monotonic();
    if (has_deadline && now >= deadline) {
      result = Done(done);
      break;
    }
    if (spinning && now < spin_end) {
      // The daemon's thread we wait for may share our CPU; so may a Python thread.
      bool yielded;
      Py_BEGIN_ALLOW_THREADS yielded = rp::SpinYield();
      Py_END_ALLOW_THREADS if (yielded) continue;
    }
    spinning = false;
    uint32_t* doorbell = Word32(self, rp::kOffCqDoorbell);
    __atomic_fetch_add(Word32(self, rp::kOffClientWaiters), 1, __ATOMIC_SEQ_CST);
    const uint32_t ring = __atomic_load_n(doorbell, __ATOMIC_SEQ_CST);
    const Py_ssize_t m = Drain(self);
    int d2 = 0;
    if (m == 0) d2 = Done(done);
    if (m == 0 && d2 == 0 && !self->closed) {
      double left = kMaxSleepS;
      if (has_deadline && deadline - now < left) left = deadline - now;
      FutexWaitNoGil(doorbell, ring, left);
    }
    __atomic_fetch_sub(Word32(self, rp::kOffClientWaiters), 1, __ATOMIC_SEQ_CST);
    if (m < 0 || d2 < 0) break;
    // A signal (Ctrl-C) ends the wait with its exception, as it would a Python loop; the
    // operation keeps running in the daemon and can be waited on again.
    if (PyErr_CheckSignals() < 0) break;
  }
  --self->foreground;
  self->foreground_until = Monotonic() + self->grace_s;
  if (result < 0) return nullptr;
  return PyBool_FromLong(result);
}

// add_waiter(delta): this process's count of threads asleep on the completion doorbell.
PyObject* RingCore_add_waiter(RingCore* self, PyObject* arg) {
  if (!Ready(self)) return nullptr;
  const long delta = PyLong_AsLong(arg);
  if (delta == -1 && PyErr_Occurred()) return nullptr;
  __atomic_fetch_add(Word32(self, rp::kOffClientWaiters), static_cast<uint32_t>(delta),
                     __ATOMIC_SEQ_CST);
  Py_RETURN_NONE;
}

// wait_doorbell(expected, seconds): sleeps while the completion doorbell reads expected.
PyObject* RingCore_wait_doorbell(RingCore* self, PyObject* args) {
  if (!Ready(self)) return nullptr;
  unsigned int expected;
  double seconds;
  if (!PyArg_ParseTuple(args, "Id", &expected, &seconds)) return nullptr;
  FutexWaitNoGil(Word32(self, rp::kOffCqDoorbell), expected, seconds);
  Py_RETURN_NONE;
}

// close(): later publishes fail, every waiter wakes.
PyObject* RingCore_close(RingCore* self, PyObject*) {
  if (!Ready(self)) return nullptr;
  self->closed = true;
  __atomic_fetch_add(Word32(self, rp::kOffCqDoorbell), 1, __ATOMIC_SEQ_CST);
  uint32_t* word = Word32(self, rp::kOffCqDoorbell);
  Py_BEGIN_ALLOW_THREADS rp::FutexWake(word, INT_MAX);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

PyObject* RingCore_get_closed(RingCore* self, void*) { return PyBool_FromLong(self->closed); }
PyObject* RingCore_get_foreground(RingCore* self, void*) {
  return PyLong_FromLong(self->foreground);
}
PyObject* RingCore_get_foreground_until(RingCore* self, void*) {
  return PyFloat_FromDouble(self->foreground_until);
}
int RingCore_set_foreground_until(RingCore* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_TypeError, "cannot delete foreground_until");
    return -1;
  }
  const double v = PyFloat_AsDouble(value);
  if (v == -1.0 && PyErr_Occurred()) return -1;
  self->foreground_until = v;
  return 0;
}
PyObject* RingCore_get_cq_doorbell(RingCore* self, void*) {
  if (!Ready(self)) return nullptr;
  return PyLong_FromUnsignedLong(
      __atomic_load_n(Word32(self, rp::kOffCqDoorbell), __ATOMIC_SEQ_CST));
}
PyObject* RingCore_get_sq_tail(RingCore* self, void*) {
  return PyLong_FromUnsignedLongLong(self->sq_tail);
}
// The daemon's head, clamped to what this client published: entries at slots below it were
// taken by the daemon (it copies an entry out, and moves its head past it, before it acts on
// it); the rest never were. Read after close(), once nothing can be published any more.
PyObject* RingCore_get_consumed_head(RingCore* self, void*) {
  if (!Ready(self)) return nullptr;
  const uint64_t head = __atomic_load_n(Word64(self, rp::kOffSqHead), __ATOMIC_ACQUIRE);
  return PyLong_FromUnsignedLongLong(head < self->sq_tail ? head : self->sq_tail);
}

PyMethodDef kMethods[] = {
    {"publish", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(RingCore_publish)),
     METH_FASTCALL,
     "publish(entries, owner=None) -> bool: all at once (owner._slot = the first one's slot), or "
     "False when they do not fit now"},
    {"drain", reinterpret_cast<PyCFunction>(RingCore_drain), METH_NOARGS,
     "drain() -> int: reads the completions there are, hands each to on_completion"},
    {"poke", reinterpret_cast<PyCFunction>(RingCore_poke), METH_NOARGS,
     "poke(): wakes the daemon if entries wait for it"},
    {"wait_until", reinterpret_cast<PyCFunction>(RingCore_wait_until), METH_VARARGS,
     "wait_until(done, deadline) -> bool"},
    {"add_waiter", reinterpret_cast<PyCFunction>(RingCore_add_waiter), METH_O, "add_waiter(delta)"},
    {"wait_doorbell", reinterpret_cast<PyCFunction>(RingCore_wait_doorbell), METH_VARARGS,
     "wait_doorbell(expected, seconds): futex wait on the completion doorbell"},
    {"close", reinterpret_cast<PyCFunction>(RingCore_close), METH_NOARGS,
     "close(): later publishes fail, every waiter wakes"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef kGetSet[] = {
    {"closed", reinterpret_cast<getter>(RingCore_get_closed), nullptr, nullptr, nullptr},
    {"foreground", reinterpret_cast<getter>(RingCore_get_foreground), nullptr, nullptr, nullptr},
    {"foreground_until", reinterpret_cast<getter>(RingCore_get_foreground_until),
     reinterpret_cast<setter>(RingCore_set_foreground_until), nullptr, nullptr},
    {"cq_doorbell", reinterpret_cast<getter>(RingCore_get_cq_doorbell), nullptr, nullptr, nullptr},
    {"sq_tail", reinterpret_cast<getter>(RingCore_get_sq_tail), nullptr, nullptr, nullptr},
    {"consumed_head", reinterpret_cast<getter>(RingCore_get_consumed_head), nullptr, nullptr,
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot kSlots[] = {
    {Py_tp_doc, const_cast<char*>(
                    "RingCore(mapping, sq_entries, cq_entries, spin_us, on_completion, grace_s)")},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},  // zero-filled: no view, indices 0
    {Py_tp_init, reinterpret_cast<void*>(RingCore_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(RingCore_dealloc)},
    {Py_tp_methods, kMethods},
    {Py_tp_getset, kGetSet},
    {0, nullptr}};

PyType_Spec kSpec = {"railyard._ringcore.RingCore", sizeof(RingCore), 0, Py_TPFLAGS_DEFAULT,
                     kSlots};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT,
                       "_ringcore",
                       "The session rings' hot path in C++ (railyard/_ring.py).",
                       -1,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__ringcore() {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  PyObject* type = PyType_FromSpec(&kSpec);
  if (type == nullptr || PyModule_AddObject(m, "RingCore", type) < 0) {
    Py_XDECREF(type);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
