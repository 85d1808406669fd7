/* The fan-out's member loop in C: gateway.wire.SocketWriter.write_each's loop,
 * with the write itself a send(2) on the socket when nothing is queued on it.
 *
 * Optional: setup.py builds it when a C compiler is there; without it the
 * same loop runs in Python (gateway/wire.py), with the same results. What it
 * saves is the interpreter's work per member and the event loop's write path
 * around the system call: at 10,000 members a pass is 10,000 writes.
 *
 * write_each(clients, data, limit, skip_conn, open_state, full, unstuck) -> int
 *
 *   clients     a sequence of gateway.hub.Client (or None: passed over)
 *   data        bytes: the complete frames, written whole to each
 *   limit       a client with more than this many bytes queued is skipped and
 *               appended to ``full``
 *   skip_conn   a conn id not to write (-1: none)
 *   open_state  websockets' State.OPEN: only clients whose ``proto.state`` is it
 *   unstuck     gets each client written whose ``stuck_since`` was set
 *
 * Returns how many clients took ``data``. Per client, as the Python loop:
 * not OPEN -> passed over; over ``limit`` queued -> ``full``; else written.
 * The write: when the transport has nothing queued (``get_write_buffer_size()``
 * is 0), is not closing and the client has a socket ``fd`` (>= 0: a plain TCP
 * transport, see gateway.wire.socket_fd), send(2) with MSG_DONTWAIT; what the
 * kernel did not take (a short write, EAGAIN) goes to ``transport.write`` as
 * the rest, to be written in order by the event loop; any other error goes to
 * ``transport.write`` whole, so the event loop meets the same error and closes
 * the connection its usual way. Otherwise ``transport.write(data)``. With an
 * empty queue this is exactly what the event loop's own write does first
 * (uvloop: write(2) at once; asyncio: sock.send at once), so the bytes on the
 * wire and their order are the same either way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sys/socket.h>

static PyObject *s_id, *s_proto, *s_state, *s_transport, *s_fd, *s_stuck_since,
    *s_get_write_buffer_size, *s_is_closing, *s_write;

/* transport.write(bytes of buf[0:len]) */
static int hand_over(PyObject *transport, PyObject *data, Py_ssize_t from) {
    PyObject *rest = data;
    if (from > 0) {
        rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + from,
                                         PyBytes_GET_SIZE(data) - from);
        if (rest == NULL) return -1;
    }
    PyObject *r = PyObject_CallMethodOneArg(transport, s_write, rest);
    if (rest != data) Py_DECREF(rest);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* send(2) what the kernel takes; the rest (a short write, EAGAIN) or all of it
   (any other error: the event loop meets it too and closes its usual way) to
   ``transport.write``. 0, or -1 with an exception set. */
static int send_direct(int fd, PyObject *transport, PyObject *data) {
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    ssize_t sent;
    do {
        sent = send(fd, PyBytes_AS_STRING(data), (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent == len) return 0;
    return hand_over(transport, data, sent < 0 ? 0 : sent);
}

/* The client's socket when it may be written directly: nothing queued on
   ``transport`` (checked by the caller), a socket (``fd`` >= 0) and the transport
   not closing (once closing its socket may be closed). -1: write through the
   transport; -2: an exception is set. */
static long direct_fd(PyObject *client, PyObject *transport) {
    PyObject *fdo = PyObject_GetAttr(client, s_fd);
    if (fdo == NULL) return -2;
    long fd = PyLong_AsLong(fdo);
    Py_DECREF(fdo);
    if (fd == -1 && PyErr_Occurred()) return -2;
    if (fd < 0) return -1;
    PyObject *r = PyObject_CallMethodNoArgs(transport, s_is_closing);
    if (r == NULL) return -2;
    int closing = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (closing < 0) return -2;
    return closing ? -1 : fd;
}

/* 1: taken, 0: passed over (not OPEN), 2: full; -1: an exception is set */
static int write_one(PyObject *client, PyObject *data, Py_ssize_t limit, PyObject *open_state) {
    PyObject *proto = PyObject_GetAttr(client, s_proto);
    if (proto == NULL) return -1;
    PyObject *state = PyObject_GetAttr(proto, s_state);
    Py_DECREF(proto);
    if (state == NULL) return -1;
    int open = state == open_state;
    Py_DECREF(state);
    if (!open) return 0;

    PyObject *transport = PyObject_GetAttr(client, s_transport);
    if (transport == NULL) return -1;
    int ret = -1;
    PyObject *r = PyObject_CallMethodNoArgs(transport, s_get_write_buffer_size);
    if (r == NULL) goto out;
    Py_ssize_t queued = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (queued == -1 && PyErr_Occurred()) goto out;
    if (queued > limit) {
        ret = 2;
        goto out;
    }
    long fd = queued == 0 ? direct_fd(client, transport) : -1;
    if (fd == -2) goto out;
    if ((fd >= 0 ? send_direct((int)fd, transport, data) : hand_over(transport, data, 0)) < 0)
        goto out;
    ret = 1;
out:
    Py_DECREF(transport);
    return ret;
}

static PyObject *write_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "write_each takes 7 arguments");
        return NULL;
    }
    PyObject *data = args[1], *open_state = args[4], *full = args[5], *unstuck = args[6];
    if (!PyBytes_CheckExact(data) || !PyList_CheckExact(full) || !PyList_CheckExact(unstuck)) {
        PyErr_SetString(PyExc_TypeError, "write_each: data must be bytes, full and unstuck lists");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    long skip = PyLong_AsLong(args[3]);
    if (skip == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "write_each: clients must be iterable");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), written = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *client = items[i];
        if (client == Py_None) continue;
        if (skip >= 0) {
            PyObject *ido = PyObject_GetAttr(client, s_id);
            if (ido == NULL) goto fail;
            long id = PyLong_AsLong(ido);
            Py_DECREF(ido);
            if (id == -1 && PyErr_Occurred()) goto fail;
            if (id == skip) continue;
        }
        int got = write_one(client, data, limit, open_state);
        if (got < 0) goto fail;
        if (got == 2) {
            if (PyList_Append(full, client) < 0) goto fail;
            continue;
        }
        if (got == 0) continue;
        written++;
        PyObject *since = PyObject_GetAttr(client, s_stuck_since);
        if (since == NULL) goto fail;
        int stuck = PyObject_IsTrue(since);
        Py_DECREF(since);
        if (stuck < 0) goto fail;
        if (stuck && PyList_Append(unstuck, client) < 0) goto fail;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(written);
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"write_each", (PyCFunction)(void (*)(void))write_each, METH_FASTCALL,
     "write_each(clients, data, limit, skip_conn, open_state, full, unstuck) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway._fanout",
    .m_doc = "The fan-out's member loop in C (see gateway/_fanout.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fanout(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_id, "id");
    INTERN(s_proto, "proto");
    INTERN(s_state, "state");
    INTERN(s_transport, "transport");
    INTERN(s_fd, "fd");
    INTERN(s_stuck_since, "stuck_since");
    INTERN(s_get_write_buffer_size, "get_write_buffer_size");
    INTERN(s_is_closing, "is_closing");
    INTERN(s_write, "write");
#undef INTERN
    return PyModule_Create(&module);
}
