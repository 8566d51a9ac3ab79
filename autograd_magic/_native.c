/* autograd_magic._native: the recorder's per-event caller lookup, compiled, and `untrack`.
 *
 * `SiteCache.here(skip)` is `recorder.sites.SiteFinder.here` without the interpreter: one walk
 * up the stack to the innermost user frame, then one lookup in an open-addressing table keyed by
 * (code object, instruction offset, and the traced code's frame offset where the frame is not
 * the traced code's own). Lines are decoded and a `Site` made only the first time a key is seen,
 * as memray and torch.profiler resolve (code, offset) pairs: every later event at that position
 * costs the walk and a probe, and allocates nothing. The pure-Python `SiteFinder.here` is the
 * reference (tests/test_native.py checks both give the same Trace) and the fallback.
 *
 * CPython C API only (no torch headers), so one build fits every torch. The table holds strong
 * references to the code objects in its keys (never a frame: frames hold the user's locals), so
 * an address in the table cannot be reused while cached.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

typedef struct {
    PyObject *code;       /* NULL: empty slot */
    PyObject *outer_code; /* the outer frame's code when it is not the traced code, else NULL */
    long long lasti;
    long long outer_lasti; /* outer frame's offset + 1; 0: no outer frame */
    PyObject *site;
} Entry;

typedef struct {
    PyObject_HEAD
    PyObject *home_code;  /* the traced code, or None */
    PyObject *library;    /* filename -> bool, shared with sites._LIBRARY_FILES */
    PyObject *is_library; /* sites.is_library_file */
    PyObject *interned;   /* (file, function, line, outer line) -> Site */
    PyObject *site_type;  /* model.records.Site */
    PyObject *unknown;    /* model.records.UNKNOWN_SITE */
    Entry *table;
    Py_ssize_t capacity; /* a power of two */
    Py_ssize_t used;
} SiteCache;

static PyObject *STAND_IN_NAME; /* caller.STAND_IN_NAME: stand-in frames are never the user's */
static PyObject *MODULE_NAME;   /* "<module>" */

static inline PyObject *code_name(PyObject *code) { return ((PyCodeObject *)code)->co_name; }
static inline PyObject *code_file(PyObject *code) { return ((PyCodeObject *)code)->co_filename; }

static inline int same_str(PyObject *a, PyObject *b) {
    /* co_name strings are interned: identity almost always decides. */
    return a == b || (PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) &&
                      PyUnicode_Compare(a, b) == 0);
}

static long long frame_lasti(PyFrameObject *frame) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    PyObject *value = PyObject_GetAttrString((PyObject *)frame, "f_lasti");
    long long lasti = value == NULL ? -1 : PyLong_AsLongLong(value);
    Py_XDECREF(value);
    return lasti;
#endif
}

static PyObject *frame_line(PyFrameObject *frame) {
    int line = PyFrame_GetLineNumber(frame);
    if (line < 0) {
        Py_RETURN_NONE; /* as `frame.f_lineno` reads */
    }
    return PyLong_FromLong(line);
}

/* 1: library (or stand-in) frame, 0: the user's frame, -1: error. `library` as in Python. */
static int is_library_frame(SiteCache *self, PyObject *code) {
    PyObject *filename = code_file(code);
    PyObject *hit = PyDict_GetItemWithError(self->library, filename);
    int result;
    if (hit == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        if (PyDict_GET_SIZE(self->library) > 65536) { /* bounded: a cell is a new file name */
            PyDict_Clear(self->library);
        }
        PyObject *answer = PyObject_CallOneArg(self->is_library, filename);
        if (answer == NULL) {
            return -1;
        }
        int stored = PyDict_SetItem(self->library, filename, answer);
        result = PyObject_IsTrue(answer);
        Py_DECREF(answer);
        if (stored < 0) {
            return -1;
        }
    } else {
        result = PyObject_IsTrue(hit);
    }
    if (result != 0) {
        return result;
    }
    return same_str(code_name(code), STAND_IN_NAME);
}

static inline size_t hash_key(PyObject *code, long long lasti, long long outer_lasti,
                              PyObject *outer_code) {
    size_t h = (size_t)code >> 4;
    h = h * 1000003u ^ (size_t)lasti;
    h = h * 1000003u ^ (size_t)outer_lasti;
    h = h * 1000003u ^ ((size_t)outer_code >> 4);
    return h ^ (h >> 17);
}

static int grow(SiteCache *self) {
    Py_ssize_t capacity = self->capacity ? self->capacity * 2 : 256;
    Entry *table = PyMem_Calloc((size_t)capacity, sizeof(Entry));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->capacity; i++) {
        Entry *old = &self->table[i];
        if (old->code == NULL) {
            continue;
        }
        size_t slot = hash_key(old->code, old->lasti, old->outer_lasti, old->outer_code);
        while (table[slot & (capacity - 1)].code != NULL) {
            slot++;
        }
        table[slot & (capacity - 1)] = *old;
    }
    PyMem_Free(self->table);
    self->table = table;
    self->capacity = capacity;
    return 0;
}

static void clear_table(SiteCache *self) {
    for (Py_ssize_t i = 0; i < self->capacity; i++) {
        Entry *e = &self->table[i];
        if (e->code != NULL) {
            Py_DECREF(e->code);
            Py_XDECREF(e->outer_code);
            Py_DECREF(e->site);
        }
    }
    PyMem_Free(self->table);
    self->table = NULL;
    self->capacity = self->used = 0;
}

/* The interned Site of (frame, outer): `SiteFinder._intern`. New reference. */
static PyObject *intern_site(SiteCache *self, PyFrameObject *frame, PyFrameObject *outer,
                             PyObject *code) {
    PyObject *line = frame_line(frame);
    PyObject *outer_line = outer == NULL ? Py_NewRef(Py_None) : frame_line(outer);
    PyObject *key = NULL, *site = NULL;
    if (line == NULL || outer_line == NULL) {
        goto done;
    }
    key = PyTuple_Pack(4, code_file(code), code_name(code), line, outer_line);
    if (key == NULL) {
        goto done;
    }
    site = PyDict_GetItemWithError(self->interned, key);
    if (site != NULL) {
        Py_INCREF(site);
        goto done;
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    PyObject *args[4] = {code_file(code), line, code_name(code), outer_line};
    site = PyObject_Vectorcall(self->site_type, args, 4, NULL);
    if (site != NULL && PyDict_SetItem(self->interned, key, site) < 0) {
        Py_CLEAR(site);
    }
done:
    Py_XDECREF(line);
    Py_XDECREF(outer_line);
    Py_XDECREF(key);
    return site;
}

static PyObject *lookup(SiteCache *self, PyFrameObject *frame) {
    PyObject *code = (PyObject *)PyFrame_GetCode(frame);
    PyObject *home = self->home_code;
    PyFrameObject *outer = NULL;
    PyObject *outer_code = NULL; /* borrowed from `outer` while it lives */
    PyObject *result = NULL;
    long long lasti = frame_lasti(frame), outer_lasti = 0;
    /* A script run with exec/%run inside the block is traced code too: its own lines count. */
    if (code != home && !same_str(code_name(code), MODULE_NAME) && home != Py_None) {
        outer = PyFrame_GetBack(frame);
        while (outer != NULL) {
            PyCodeObject *c = PyFrame_GetCode(outer);
            int stop = (PyObject *)c == home || same_str(c->co_name, MODULE_NAME);
            Py_DECREF(c);
            if (stop) {
                break;
            }
            PyFrameObject *back = PyFrame_GetBack(outer);
            Py_DECREF(outer);
            outer = back;
        }
        if (outer != NULL) {
            PyCodeObject *c = PyFrame_GetCode(outer);
            outer_lasti = frame_lasti(outer) + 1;
            if ((PyObject *)c != home) {
                outer_code = (PyObject *)c;
            }
            Py_DECREF(c); /* still referenced by `outer` */
        }
    }
    if (self->capacity == 0 && grow(self) < 0) {
        goto done;
    }
    size_t mask = (size_t)self->capacity - 1;
    size_t slot = hash_key(code, lasti, outer_lasti, outer_code);
    for (;; slot++) {
        Entry *e = &self->table[slot & mask];
        if (e->code == NULL) {
            break;
        }
        if (e->code == code && e->lasti == lasti && e->outer_lasti == outer_lasti &&
            e->outer_code == outer_code) {
            result = Py_NewRef(e->site);
            goto done;
        }
    }
    result = intern_site(self, frame, outer, code);
    if (result == NULL) {
        goto done;
    }
    if ((self->used + 1) * 2 > self->capacity) {
        if (grow(self) < 0) {
            Py_CLEAR(result);
            goto done;
        }
        mask = (size_t)self->capacity - 1;
    }
    slot = hash_key(code, lasti, outer_lasti, outer_code);
    while (self->table[slot & mask].code != NULL) {
        slot++;
    }
    Entry *e = &self->table[slot & mask];
    e->code = Py_NewRef(code);
    e->outer_code = Py_XNewRef(outer_code);
    e->lasti = lasti;
    e->outer_lasti = outer_lasti;
    e->site = Py_NewRef(result);
    self->used++;
done:
    Py_XDECREF(outer);
    Py_DECREF(code);
    return result;
}

static PyObject *SiteCache_here(SiteCache *self, PyObject *const *args, Py_ssize_t nargs) {
    long skip = 1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "here() takes at most one argument (skip)");
        return NULL;
    }
    if (nargs == 1) {
        skip = PyLong_AsLong(args[0]);
        if (skip == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    /* No Python frame for this call: the current frame is `here`'s caller, so `skip` more
     * steps reach `sys._getframe(skip + 1)` as seen from a Python `here`. */
    /* Fewer frames than `skip` (a hook on a thread with no Python caller: TorchScript's fork
     * workers, autograd's device threads): the unknown site, as the Python `here` gives. */
    PyFrameObject *frame = PyEval_GetFrame();
    if (frame == NULL) {
        return Py_NewRef(self->unknown);
    }
    Py_INCREF(frame);
    for (long i = 0; i < skip; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        if (back == NULL) {
            return Py_NewRef(self->unknown);
        }
        frame = back;
    }
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int library = is_library_frame(self, (PyObject *)code);
        Py_DECREF(code);
        if (library < 0) {
            Py_DECREF(frame);
            return NULL;
        }
        if (!library) {
            break;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    if (frame == NULL) {
        return Py_NewRef(self->unknown);
    }
    PyObject *site = lookup(self, frame);
    Py_DECREF(frame);
    return site;
}

static PyObject *SiteCache_clear(SiteCache *self, PyObject *Py_UNUSED(ignored)) {
    clear_table(self);
    Py_RETURN_NONE;
}

static PyObject *SiteCache_size(SiteCache *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSsize_t(self->used);
}

static int SiteCache_init(SiteCache *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"home_code", "library", "is_library", "interned", "site_type",
                            "unknown", NULL};
    PyObject *home, *library, *is_library, *interned, *site_type, *unknown;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO!OO", names, &home, &PyDict_Type,
                                     &library, &is_library, &PyDict_Type, &interned, &site_type,
                                     &unknown)) {
        return -1;
    }
    Py_XSETREF(self->home_code, Py_NewRef(home));
    Py_XSETREF(self->library, Py_NewRef(library));
    Py_XSETREF(self->is_library, Py_NewRef(is_library));
    Py_XSETREF(self->interned, Py_NewRef(interned));
    Py_XSETREF(self->site_type, Py_NewRef(site_type));
    Py_XSETREF(self->unknown, Py_NewRef(unknown));
    clear_table(self);
    return 0;
}

static int SiteCache_traverse(SiteCache *self, visitproc visit, void *arg) {
    Py_VISIT(self->home_code);
    Py_VISIT(self->library);
    Py_VISIT(self->is_library);
    Py_VISIT(self->interned);
    Py_VISIT(self->site_type);
    Py_VISIT(self->unknown);
    return 0;
}

static int SiteCache_tp_clear(SiteCache *self) {
    Py_CLEAR(self->home_code);
    Py_CLEAR(self->library);
    Py_CLEAR(self->is_library);
    Py_CLEAR(self->interned);
    Py_CLEAR(self->site_type);
    Py_CLEAR(self->unknown);
    clear_table(self);
    return 0;
}

static void SiteCache_dealloc(SiteCache *self) {
    PyObject_GC_UnTrack(self);
    SiteCache_tp_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *SiteCache_get_home(SiteCache *self, void *Py_UNUSED(closure)) {
    return Py_NewRef(self->home_code ? self->home_code : Py_None);
}

static int SiteCache_set_home(SiteCache *self, PyObject *value, void *Py_UNUSED(closure)) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "home_code cannot be deleted");
        return -1;
    }
    Py_XSETREF(self->home_code, Py_NewRef(value));
    clear_table(self); /* keys were made relative to the old traced code */
    return 0;
}

static PyMethodDef SiteCache_methods[] = {
    {"here", (PyCFunction)(void (*)(void))SiteCache_here, METH_FASTCALL,
     "here(skip=1): the Site of the calling event, `skip` frames above the caller."},
    {"clear", (PyCFunction)SiteCache_clear, METH_NOARGS, "Forget every cached position."},
    {"size", (PyCFunction)SiteCache_size, METH_NOARGS, "How many positions are cached."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SiteCache_getset[] = {
    {"home_code", (getter)SiteCache_get_home, (setter)SiteCache_set_home,
     "The traced code (its frame's line is each site's outer line).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SiteCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._native.SiteCache",
    .tp_basicsize = sizeof(SiteCache),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Caller positions of one block, cached by (code, instruction offset).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SiteCache_init,
    .tp_dealloc = (destructor)SiteCache_dealloc,
    .tp_traverse = (traverseproc)SiteCache_traverse,
    .tp_clear = (inquiry)SiteCache_tp_clear,
    .tp_methods = SiteCache_methods,
    .tp_getset = SiteCache_getset,
};

/* untrack(record): the record, no longer scanned by the cycle collector.
 *
 * A block's records (node, buffer, write, link records and timeline samples) hold only ints,
 * strings, tuples and interned Sites: they can never be part of a reference cycle, so the
 * collector has nothing to find in them, yet each one it tracks is walked by every collection
 * that reaches its generation, and the records accumulate (100,000 of each kind by default) into
 * the oldest one, where their number also triggers more full collections. Untracked, a block of
 * a million events costs the user's own collections nothing. Refcounting frees them as before. */
static PyObject *untrack(PyObject *Py_UNUSED(module), PyObject *record) {
    if (PyObject_IS_GC(record) && PyObject_GC_IsTracked(record)) {
        PyObject_GC_UnTrack(record);
    }
    Py_INCREF(record);
    return record;
}

/* NodeTag(writer_ref, node_id): what `recorder.nodes` stores in an autograd node's metadata.
 *
 * The same contract as the pure-Python `nodes.NodeTag` (a tuple subclass): `tag[0]` is the
 * writer's weak reference, `tag[1]` and `tag.node_id` the node's id, and when the C++ node is
 * destroyed the tag's death calls `report(writer_ref, node_id)` (`nodes.report_node_death`).
 *
 * It is not a container the cycle collector knows: it holds only a weak reference (which holds
 * nothing back) and an int, so it can never be part of a cycle. A Python tag is tracked, and so
 * is the metadata dict it makes tracked; every live node of a graph then adds two objects that
 * survive the young collections into the oldest generation, where their number triggers full
 * collections of the user's whole heap (one every few steps of a loop of small ops). With this
 * tag the metadata dict stays untracked too. */
typedef struct {
    PyObject_HEAD
    PyObject *writer_ref;
    long long node_id;
} NodeTag;

static PyObject *REPORT_DEATH; /* nodes.report_node_death, set by set_death_reporter */

static void NodeTag_dealloc(NodeTag *self) {
    PyObject *report = REPORT_DEATH;
    if (report != NULL && PyWeakref_GetObject(self->writer_ref) != Py_None) {
        /* As CPython runs a `__del__`: the error state is kept, and what escapes the reporter
         * (an interrupt on its first instruction) goes to the unraisable hook, whose filter
         * (`deferred.took`) holds it and runs the reporter again. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *id = PyLong_FromLongLong(self->node_id);
        if (id != NULL) {
            PyObject *args[2] = {self->writer_ref, id};
            PyObject *result = PyObject_Vectorcall(report, args, 2, NULL);
            Py_DECREF(id);
            if (result == NULL) {
                PyErr_WriteUnraisable(report);
            }
            Py_XDECREF(result);
        } else {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, traceback);
    }
    Py_XDECREF(self->writer_ref);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject NodeTagType;

static PyObject *new_node_tag(PyObject *Py_UNUSED(module), PyObject *const *args,
                              Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "node_tag(writer_ref, node_id) takes two arguments");
        return NULL;
    }
    if (!PyWeakref_CheckRef(args[0])) {
        PyErr_SetString(PyExc_TypeError, "node_tag: writer_ref must be a weak reference");
        return NULL;
    }
    long long node_id = PyLong_AsLongLong(args[1]);
    if (node_id == -1 && PyErr_Occurred()) {
        return NULL;
    }
    NodeTag *tag = PyObject_New(NodeTag, &NodeTagType);
    if (tag == NULL) {
        return NULL;
    }
    tag->writer_ref = Py_NewRef(args[0]);
    tag->node_id = node_id;
    return (PyObject *)tag;
}

static Py_ssize_t NodeTag_length(PyObject *Py_UNUSED(self)) { return 2; }

static PyObject *NodeTag_item(NodeTag *self, Py_ssize_t index) {
    if (index == 0) {
        return Py_NewRef(self->writer_ref);
    }
    if (index == 1) {
        return PyLong_FromLongLong(self->node_id);
    }
    PyErr_SetString(PyExc_IndexError, "NodeTag index out of range");
    return NULL;
}

static PySequenceMethods NodeTag_as_sequence = {
    .sq_length = NodeTag_length,
    .sq_item = (ssizeargfunc)NodeTag_item,
};

static PyMemberDef NodeTag_members[] = {
    {"node_id", T_LONGLONG, offsetof(NodeTag, node_id), READONLY, "The node's id in its trace."},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *NodeTag_repr(NodeTag *self) {
    return PyUnicode_FromFormat("NodeTag(node_id=%lld)", self->node_id);
}

static PyTypeObject NodeTagType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._native.NodeTag",
    .tp_basicsize = sizeof(NodeTag),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An autograd node's tag: reports the node's death to its block's writer.",
    .tp_dealloc = (destructor)NodeTag_dealloc,
    .tp_repr = (reprfunc)NodeTag_repr,
    .tp_as_sequence = &NodeTag_as_sequence,
    .tp_members = NodeTag_members,
};

static PyObject *set_death_reporter(PyObject *Py_UNUSED(module), PyObject *report) {
    Py_XSETREF(REPORT_DEATH, Py_NewRef(report));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"untrack", (PyCFunction)untrack, METH_O,
     "untrack(record): `record`, left out of the cycle collector's scans (it holds no cycle)."},
    {"node_tag", (PyCFunction)(void (*)(void))new_node_tag, METH_FASTCALL,
     "node_tag(writer_ref, node_id): a NodeTag (see nodes.NodeTag)."},
    {"set_death_reporter", (PyCFunction)set_death_reporter, METH_O,
     "set_death_reporter(report): called as report(writer_ref, node_id) when a tag dies."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    STAND_IN_NAME = PyUnicode_InternFromString("autograd_magic_call");
    MODULE_NAME = PyUnicode_InternFromString("<module>");
    if (STAND_IN_NAME == NULL || MODULE_NAME == NULL || PyType_Ready(&SiteCacheType) < 0 ||
        PyType_Ready(&NodeTagType) < 0) {
        return -1;
    }
    Py_INCREF(&NodeTagType);
    if (PyModule_AddObject(module, "NodeTag", (PyObject *)&NodeTagType) < 0) {
        Py_DECREF(&NodeTagType);
        return -1;
    }
    Py_INCREF(&SiteCacheType);
    if (PyModule_AddObject(module, "SiteCache", (PyObject *)&SiteCacheType) < 0) {
        Py_DECREF(&SiteCacheType);
        return -1;
    }
    return PyModule_AddStringConstant(module, "STAND_IN_NAME", "autograd_magic_call");
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, (void *)exec_module}, {0, NULL}};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "autograd_magic._native",
    .m_doc = "The recorder's per-event caller lookup, compiled (see recorder/native.py).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&native_module); }
