/* autograd_magic._counted: watch mode's per-saved-tensor work (recorder/counting.py), compiled.
 *
 * `Packer(live, peek)` is a counted step's pack hook and `unpack` its unpack hook. They do what
 * the pure-Python `StepCounter._pack_hook` and `counting._unpack` do, with the same results
 * (tests/test_counting.py runs both): a saved input or leaf kept whole in `saved.SLOTS` (a C++
 * reference, never its Python object), a saved output kept as a detached alias (trap 1), the
 * version checked at unpack (trap 2), and the counters of live saved tensors and of the bytes
 * of distinct storages only the graph holds. The packed object (`CountedSaved`) counts its own
 * release when it dies, with no Python `__del__`: no frame, and no instruction where an
 * interrupt could land half-way.
 *
 * What is rare or subtle stays in Python and is called from here: an interrupt held for this
 * thread (`deferred.raise_pending`), whether a node type may save (`saved.may_own_saved`), a
 * tensor without plain storage, a detach while a profiler runs, a new slot, the in-place error's
 * text. A packed object holds its packer (counters and the table of live storages: ints,
 * shapes, dtypes, lines, names) and never the counter, whose block frame holds the user's
 * locals; the packer sees that frame only while its counter is installed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

/* Set once by configure(): the Python side of what is rare (see above). */
static PyObject *PENDING;          /* deferred.pending: thread id -> held interrupt */
static PyObject *RAISE_PENDING;    /* deferred.raise_pending */
static PyObject *MAY_OWN_SAVED;    /* saved.may_own_saved */
static PyObject *UNLISTED_DETACH;  /* saved._unlisted_detach */
static PyObject *PROFILER_ENABLED; /* torch_api.profiler_enabled */
static PyObject *STORAGE_OF;       /* saved.storage_of */
static PyObject *SLOTS_HOLD;       /* saved.SLOTS.hold */
static PyObject *EMPTY;            /* saved.SLOTS._empty: what a released slot holds */
static PyObject *SLOT_TABLE;       /* saved.SLOTS._table, or None */
static PyObject *FREE_SLOTS;       /* saved.SLOTS._free (a list) */
static PyObject *VERSION_ERROR;    /* saved.version_error_text */
static PyObject *DETACHED_MESSAGE; /* inplace_text.DETACHED_MESSAGE */
static PyObject *PARAMETER_TYPE;   /* torch.nn.Parameter */
static PyObject *TENSOR_TYPE;      /* torch.Tensor */
static PyObject *DEVICE_TYPES;     /* device -> device.type, filled as devices are met */
static PyObject *HELD_PARAMETER, *HELD_USER, *HELD_NONE, *META;
static PyObject *S_grad_fn, *S_sequence_nr, *S_version, *S_name, *S_output_nr, *S_is_view,
    *S_base, *S_is_leaf, *S_requires_grad, *S_dict, *S_untyped_storage, *S_device, *S_type,
    *S_data_ptr, *S_nbytes, *S_shape, *S_dtype, *S_detach;

enum { USES, BYTES, COUNTED, SHAPE, DTYPE, LINE, MODULE, HELD_BY, ENTRY_SIZE };

typedef struct {
    PyObject_HEAD
    PyObject *live;   /* storage key -> [uses, bytes, counted, shape, dtype, line, module, held_by] */
    PyObject *frame;  /* the watched block's frame, or None: each new storage notes its line */
    PyObject *module; /* the top-level module running now ("" outside any) */
    PyObject *peek;   /* the next node's sequence number on this thread */
    PyObject *on_pile; /* called once when live counted bytes pass pile_limit, or None */
    vectorcallfunc vectorcall;
    long long packed, released, packed_bytes, released_bytes, peak;
    long long roots_died; /* backward roots whose node died (their RootTag with it) */
    long long next_negative; /* the key of the next storage-less tensor */
    long long pile_limit;    /* live counted bytes past which on_pile is called (0: never) */
} Packer;

typedef struct {
    PyObject_HEAD
    Packer *packer;
    PyObject *kept;         /* a saved output's detached alias (or a kept input with no slot) */
    PyObject *grad_fn_name; /* a saved output's node name, for the in-place error; else NULL */
    long long version;
    long long key;
    Py_ssize_t slot;
    int output_nr; /* -1 for a kept input */
    char had_grad_fn;
} CountedSaved;

static PyTypeObject CountedSavedType;

static int as_long_long(PyObject *value, long long *out) {
    if (value == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int truth_of(PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    int answer = PyObject_IsTrue(value);
    Py_DECREF(value);
    return answer;
}

/* --- saved.SLOTS, as TensorSlots.hold / release do it ----------------------------------- */

static Py_ssize_t hold_in_slot(PyObject *tensor) {
    if (SLOT_TABLE == Py_None) {
        return -1;
    }
    Py_ssize_t free_count = PyList_GET_SIZE(FREE_SLOTS);
    if (free_count == 0) { /* a new slot: TensorSlots.hold grows the table under its lock */
        long long slot;
        if (as_long_long(PyObject_CallOneArg(SLOTS_HOLD, tensor), &slot) < 0) {
            return -2;
        }
        return (Py_ssize_t)slot;
    }
    PyObject *index = Py_NewRef(PyList_GET_ITEM(FREE_SLOTS, free_count - 1));
    if (PyList_SetSlice(FREE_SLOTS, free_count - 1, free_count, NULL) < 0 ||
        PyObject_SetItem(SLOT_TABLE, index, tensor) < 0) {
        Py_DECREF(index);
        return -2;
    }
    Py_ssize_t slot = PyLong_AsSsize_t(index);
    Py_DECREF(index);
    return slot;
}

static void release_slot(Py_ssize_t slot) {
    /* As TensorSlots.release: the tensor's last reference dies here, after the slot is free. */
    PyObject *index = PyLong_FromSsize_t(slot);
    if (index == NULL) {
        return;
    }
    PyObject *tensor = PyObject_GetItem(SLOT_TABLE, index);
    if (tensor != NULL && PyObject_SetItem(SLOT_TABLE, index, EMPTY) == 0) {
        PyList_Append(FREE_SLOTS, index);
    }
    Py_XDECREF(tensor);
    Py_DECREF(index);
}

/* --- the packed object -------------------------------------------------------------------- */

static void entry_released(Packer *packer, long long key) {
    PyObject *key_object = PyLong_FromLongLong(key);
    if (key_object == NULL) {
        return;
    }
    PyObject *entry = PyDict_GetItemWithError(packer->live, key_object); /* borrowed */
    if (entry != NULL && PyList_Check(entry) && PyList_GET_SIZE(entry) == ENTRY_SIZE) {
        Py_INCREF(entry);
        long long uses = PyLong_AsLongLong(PyList_GET_ITEM(entry, USES)) - 1;
        PyObject *uses_object = PyLong_FromLongLong(uses);
        if (uses_object != NULL) {
            PyList_SetItem(entry, USES, uses_object); /* steals */
        }
        if (uses <= 0 && PyDict_DelItem(packer->live, key_object) == 0 &&
            PyObject_IsTrue(PyList_GET_ITEM(entry, COUNTED)) == 1) {
            packer->released_bytes += PyLong_AsLongLong(PyList_GET_ITEM(entry, BYTES));
        }
        Py_DECREF(entry);
    }
    Py_DECREF(key_object);
}

static void CountedSaved_dealloc(CountedSaved *self) {
    /* Autograd let go of the saved tensor. Never raise from here: errors are dropped, as
     * PackedSaved.__del__ drops them, and the caller's error state is kept. */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (self->slot >= 0) {
        release_slot(self->slot);
    }
    Packer *packer = self->packer;
    if (packer != NULL) {
        packer->released += 1;
        entry_released(packer, self->key);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    Py_XDECREF(self->kept);
    Py_XDECREF(self->grad_fn_name);
    Py_XDECREF(packer);
    PyObject_Free(self);
}

static PyObject *CountedSaved_tensor(CountedSaved *self, void *Py_UNUSED(closure)) {
    if (self->slot >= 0) {
        PyObject *index = PyLong_FromSsize_t(self->slot);
        if (index == NULL) {
            return NULL;
        }
        PyObject *tensor = PyObject_GetItem(SLOT_TABLE, index);
        Py_DECREF(index);
        return tensor;
    }
    return Py_NewRef(self->kept != NULL ? self->kept : Py_None);
}

static PyObject *CountedSaved_held_in_slot(CountedSaved *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->slot >= 0);
}

static PyGetSetDef CountedSaved_getset[] = {
    {"tensor", (getter)CountedSaved_tensor, NULL, "The saved tensor (see PackedSaved.tensor).",
     NULL},
    {"held_in_slot", (getter)CountedSaved_held_in_slot, NULL,
     "True when only a C++ reference holds the tensor.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef CountedSaved_members[] = {
    {"version", T_LONGLONG, offsetof(CountedSaved, version), READONLY, "Version at saving."},
    {"buffer_id", T_LONGLONG, offsetof(CountedSaved, key), READONLY, "Its storage key."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CountedSavedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._counted.CountedSaved",
    .tp_basicsize = sizeof(CountedSaved),
    .tp_flags = Py_TPFLAGS_DEFAULT, /* holds no cycle: the collector never scans it */
    .tp_doc = "What autograd holds in a saved slot during a counted step.",
    .tp_dealloc = (destructor)CountedSaved_dealloc,
    .tp_getset = CountedSaved_getset,
    .tp_members = CountedSaved_members,
};

/* --- the pack hook ------------------------------------------------------------------------ */

/* Whether a tensor's `grad_fn` cannot be the node being built, so that keeping it whole makes
 * no cycle (trap 1): 1 keep, 0 detach, -1 error. */
static int keep_whole(Packer *self, PyObject *grad_fn) {
    if (grad_fn == Py_None) {
        return 1;
    }
    long long sequence_nr, next;
    if (as_long_long(PyObject_CallMethodNoArgs(grad_fn, S_sequence_nr), &sequence_nr) < 0 ||
        as_long_long(PyObject_CallNoArgs(self->peek), &next) < 0) {
        return -1;
    }
    if (sequence_nr != next - 1) {
        return 1;
    }
    int may_own = truth_of(PyObject_CallOneArg(MAY_OWN_SAVED, (PyObject *)Py_TYPE(grad_fn)));
    return may_own < 0 ? -1 : !may_own;
}

static PyObject *detached(PyObject *tensor) {
    int profiling = truth_of(PyObject_CallNoArgs(PROFILER_ENABLED));
    if (profiling < 0) {
        return NULL;
    }
    if (profiling) { /* saved._unlisted_detach leaves it out of the profiler's ops */
        return PyObject_CallOneArg(UNLISTED_DETACH, tensor);
    }
    return PyObject_CallMethodNoArgs(tensor, S_detach);
}

/* saved.is_parameter: 1, 0, or -1 on error. */
static int is_parameter(PyObject *tensor) {
    PyObject *cls = (PyObject *)Py_TYPE(tensor);
    if (cls == PARAMETER_TYPE) {
        return 1;
    }
    if (cls == TENSOR_TYPE) {
        int has_dict = truth_of(PyObject_GetAttr(tensor, S_dict));
        if (has_dict <= 0) {
            return has_dict;
        }
    }
    return PyObject_IsInstance(tensor, PARAMETER_TYPE);
}

/* saved.held_by_at_saving: a new reference to "parameter", "user tensor" or "". */
static PyObject *held_by(PyObject *tensor) {
    int view = truth_of(PyObject_CallMethodNoArgs(tensor, S_is_view));
    if (view < 0) {
        return NULL;
    }
    PyObject *root = view ? PyObject_GetAttr(tensor, S_base) : Py_NewRef(tensor);
    if (root == NULL) {
        return NULL;
    }
    PyObject *answer = HELD_NONE;
    int leaf = root == Py_None ? 0 : truth_of(PyObject_GetAttr(root, S_is_leaf));
    int grad = leaf > 0 ? truth_of(PyObject_GetAttr(root, S_requires_grad)) : 0;
    int parameter = grad > 0 ? is_parameter(root) : 0;
    Py_DECREF(root);
    if (leaf < 0 || grad < 0 || parameter < 0) {
        return NULL;
    }
    if (grad > 0) {
        answer = parameter ? HELD_PARAMETER : HELD_USER;
    }
    return Py_NewRef(answer);
}

/* saved.storage_of: (storage key, bytes); key 0 for a tensor without plain storage. */
static int storage_of(PyObject *tensor, long long *key, long long *size) {
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, S_untyped_storage);
    PyObject *device = storage == NULL ? NULL : PyObject_GetAttr(storage, S_device);
    PyObject *kind = device == NULL ? NULL : PyDict_GetItemWithError(DEVICE_TYPES, device);
    if (device != NULL && kind == NULL && !PyErr_Occurred()) {
        kind = PyObject_GetAttr(device, S_type); /* once per device */
        if (kind != NULL && PyDict_SetItem(DEVICE_TYPES, device, kind) < 0) {
            Py_CLEAR(kind);
        }
        Py_XDECREF(kind); /* the dict holds it */
    }
    int plain = kind != NULL && PyUnicode_Compare(kind, META) != 0;
    int ok = plain && as_long_long(PyObject_CallMethodNoArgs(storage, S_data_ptr), key) == 0 &&
             as_long_long(PyObject_CallMethodNoArgs(storage, S_nbytes), size) == 0;
    Py_XDECREF(device);
    Py_XDECREF(storage);
    if (ok) {
        return 0;
    }
    PyErr_Clear(); /* the rare cases, and every error, as saved.storage_of sorts them */
    PyObject *pair = PyObject_CallOneArg(STORAGE_OF, tensor);
    if (pair == NULL) {
        return -1;
    }
    int parsed = PyArg_ParseTuple(pair, "LL", key, size);
    Py_DECREF(pair);
    return parsed ? 0 : -1;
}

static int fill(Packer *self, CountedSaved *packed, PyObject *tensor, PyObject *grad_fn) {
    int keep = keep_whole(self, grad_fn);
    if (keep < 0 || as_long_long(PyObject_GetAttr(tensor, S_version), &packed->version) < 0) {
        return -1;
    }
    if (keep) {
        packed->slot = hold_in_slot(tensor);
        if (packed->slot == -2) {
            packed->slot = -1;
            return -1;
        }
        if (packed->slot < 0) {
            packed->kept = Py_NewRef(tensor);
        }
        packed->had_grad_fn = grad_fn != Py_None;
        return 0;
    }
    packed->kept = detached(tensor);
    if (packed->kept == NULL) {
        return -1;
    }
    packed->grad_fn_name = PyObject_CallMethodNoArgs(grad_fn, S_name);
    long long output_nr;
    if (packed->grad_fn_name == NULL ||
        as_long_long(PyObject_GetAttr(tensor, S_output_nr), &output_nr) < 0) {
        return -1;
    }
    packed->output_nr = (int)output_nr;
    return 0;
}

static PyObject *new_entry(Packer *self, PyObject *tensor, long long size, int counted,
                           PyObject *holder) {
    int line = self->frame == Py_None ? 0 : PyFrame_GetLineNumber((PyFrameObject *)self->frame);
    PyObject *shape = PyObject_GetAttr(tensor, S_shape);
    PyObject *dtype = shape == NULL ? NULL : PyObject_GetAttr(tensor, S_dtype);
    PyObject *entry = dtype == NULL ? NULL
                                    : Py_BuildValue("[iLOOOiOO]", 1, size, counted ? Py_True : Py_False,
                                                    shape, dtype, line, self->module, holder);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    if (entry != NULL && PyObject_GC_IsTracked(entry)) {
        PyObject_GC_UnTrack(entry); /* ints, strings, a Size, a dtype: in no cycle */
    }
    return entry;
}

/* Live counted bytes passed the pile limit: disarm it and tell on_pile, once. Its errors are
 * dropped: the user's op that saved the tensor must not fail for the watcher's sake. */
static void pile_passed(Packer *self) {
    self->pile_limit = 0;
    if (self->on_pile == NULL || self->on_pile == Py_None) {
        return;
    }
    PyObject *result = PyObject_CallNoArgs(self->on_pile);
    if (result == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(result);
}

/* Count a new use of the tensor's storage; its bytes once, when only the graph holds it. */
static int count_storage(Packer *self, CountedSaved *packed, PyObject *tensor, PyObject *holder) {
    long long key, size;
    if (storage_of(tensor, &key, &size) < 0) {
        return -1;
    }
    if (key == 0) {
        key = self->next_negative--;
    }
    packed->key = key;
    int counted = PyUnicode_GET_LENGTH(holder) == 0;
    PyObject *key_object = PyLong_FromLongLong(key);
    if (key_object == NULL) {
        return -1;
    }
    PyObject *entry = PyDict_GetItemWithError(self->live, key_object); /* borrowed */
    int status = 0;
    if (entry == NULL) {
        entry = PyErr_Occurred() ? NULL : new_entry(self, tensor, size, counted, holder);
        status = entry == NULL ? -1 : PyDict_SetItem(self->live, key_object, entry);
        Py_XDECREF(entry);
    } else {
        long long uses = PyLong_AsLongLong(PyList_GET_ITEM(entry, USES));
        PyList_SetItem(entry, USES, PyLong_FromLongLong(uses + 1));
        if (!counted || PyList_GET_ITEM(entry, COUNTED) == Py_True) {
            counted = 0;
        } else { /* a storage first saved through a parameter's view */
            PyList_SetItem(entry, COUNTED, Py_NewRef(Py_True));
        }
    }
    Py_DECREF(key_object);
    if (status == 0 && counted) {
        self->packed_bytes += size;
        long long total = self->packed_bytes - self->released_bytes;
        if (total > self->peak) {
            self->peak = total;
        }
        if (self->pile_limit > 0 && total > self->pile_limit) {
            pile_passed(self);
        }
    }
    return status;
}

static PyObject *Packer_vectorcall(Packer *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a pack hook takes one tensor");
        return NULL;
    }
    PyObject *tensor = args[0];
    if (PyDict_GET_SIZE(PENDING) > 0) {
        PyObject *none = PyObject_CallNoArgs(RAISE_PENDING);
        if (none == NULL) {
            return NULL;
        }
        Py_DECREF(none);
    }
    PyObject *grad_fn = PyObject_GetAttr(tensor, S_grad_fn);
    if (grad_fn == NULL) {
        return NULL;
    }
    CountedSaved *packed = PyObject_New(CountedSaved, &CountedSavedType);
    if (packed == NULL) {
        Py_DECREF(grad_fn);
        return NULL;
    }
    packed->packer = (Packer *)Py_NewRef(self);
    packed->kept = packed->grad_fn_name = NULL;
    packed->version = packed->key = 0;
    packed->slot = -1;
    packed->output_nr = -1;
    packed->had_grad_fn = 0;
    self->packed += 1; /* at once: its death counts it released */
    int status = fill(self, packed, tensor, grad_fn);
    Py_DECREF(grad_fn);
    PyObject *holder = status < 0 ? NULL : held_by(tensor);
    if (holder == NULL || count_storage(self, packed, tensor, holder) < 0) {
        Py_XDECREF(holder);
        Py_DECREF(packed);
        return NULL;
    }
    Py_DECREF(holder);
    return (PyObject *)packed;
}

static PyObject *Packer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *live, *peek;
    static char *names[] = {"live", "peek", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O:Packer", names, &PyDict_Type, &live,
                                     &peek)) {
        return NULL;
    }
    if (PENDING == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "autograd_magic._counted.configure() was not called");
        return NULL;
    }
    Packer *self = (Packer *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->live = Py_NewRef(live);
    self->peek = Py_NewRef(peek);
    self->on_pile = Py_NewRef(Py_None);
    self->frame = Py_NewRef(Py_None);
    self->module = PyUnicode_FromString("");
    self->vectorcall = (vectorcallfunc)Packer_vectorcall;
    self->next_negative = -1;
    if (self->module == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Packer_traverse(Packer *self, visitproc visit, void *arg) {
    Py_VISIT(self->live);
    Py_VISIT(self->frame);
    Py_VISIT(self->module);
    Py_VISIT(self->peek);
    Py_VISIT(self->on_pile);
    return 0;
}

static int Packer_clear(Packer *self) {
    Py_CLEAR(self->live);
    Py_CLEAR(self->frame);
    Py_CLEAR(self->module);
    Py_CLEAR(self->peek);
    Py_CLEAR(self->on_pile);
    return 0;
}

static void Packer_dealloc(Packer *self) {
    PyObject_GC_UnTrack(self);
    Packer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int set_frame(Packer *self, PyObject *value, void *Py_UNUSED(closure)) {
    if (value == NULL || (value != Py_None && !PyFrame_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "frame must be a frame or None");
        return -1;
    }
    Py_XSETREF(self->frame, Py_NewRef(value));
    return 0;
}

static PyObject *get_frame(Packer *self, void *Py_UNUSED(closure)) {
    return Py_NewRef(self->frame);
}

static int set_module(Packer *self, PyObject *value, void *Py_UNUSED(closure)) {
    if (value == NULL || !PyUnicode_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "module must be a str");
        return -1;
    }
    Py_XSETREF(self->module, Py_NewRef(value));
    return 0;
}

static PyObject *get_module(Packer *self, void *Py_UNUSED(closure)) {
    return Py_NewRef(self->module);
}

static PyGetSetDef Packer_getset[] = {
    {"frame", (getter)get_frame, (setter)set_frame, "The watched block's frame, or None.", NULL},
    {"module", (getter)get_module, (setter)set_module, "The top-level module running now.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Packer_members[] = {
    {"packed", T_LONGLONG, offsetof(Packer, packed), 0, "Saved tensors packed."},
    {"released", T_LONGLONG, offsetof(Packer, released), 0, "Packed objects that died."},
    {"packed_bytes", T_LONGLONG, offsetof(Packer, packed_bytes), 0, "Counted bytes packed."},
    {"released_bytes", T_LONGLONG, offsetof(Packer, released_bytes), 0,
     "Counted bytes released."},
    {"peak", T_LONGLONG, offsetof(Packer, peak), 0, "Peak live counted bytes this step."},
    {"roots_died", T_LONGLONG, offsetof(Packer, roots_died), 0, "Tagged roots that died."},
    {"pile_limit", T_LONGLONG, offsetof(Packer, pile_limit), 0,
     "Live counted bytes past which on_pile is called once (0: never)."},
    {"on_pile", T_OBJECT, offsetof(Packer, on_pile), 0, "Called when bytes pass pile_limit."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PackerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._counted.Packer",
    .tp_basicsize = sizeof(Packer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A counted step's pack hook (see recorder/counting.py).",
    .tp_new = Packer_new,
    .tp_dealloc = (destructor)Packer_dealloc,
    .tp_traverse = (traverseproc)Packer_traverse,
    .tp_clear = (inquiry)Packer_clear,
    .tp_vectorcall_offset = offsetof(Packer, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getset = Packer_getset,
    .tp_members = Packer_members,
};

/* --- the backward roots' tags --------------------------------------------------------------- */

/* Stored in a backward root's `node.metadata`, it dies with the C++ node and counts that death
 * in its packer: no Python `__del__`. It holds only its packer, so it is in no cycle. */
typedef struct {
    PyObject_HEAD
    Packer *packer;
} RootTag;

static void RootTag_dealloc(RootTag *self) {
    self->packer->roots_died += 1;
    Py_DECREF(self->packer);
    PyObject_Free(self);
}

static PyTypeObject RootTagType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._counted.RootTag",
    .tp_basicsize = sizeof(RootTag),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A backward root's tag: counts the node's death in its packer.",
    .tp_dealloc = (destructor)RootTag_dealloc,
};

static PyObject *Packer_root_tag(Packer *self, PyObject *Py_UNUSED(ignored)) {
    RootTag *tag = PyObject_New(RootTag, &RootTagType);
    if (tag == NULL) {
        return NULL;
    }
    tag->packer = (Packer *)Py_NewRef(self);
    return (PyObject *)tag;
}

static PyMethodDef Packer_methods[] = {
    {"root_tag", (PyCFunction)Packer_root_tag, METH_NOARGS,
     "A tag for a backward root's node.metadata: its death counts in roots_died."},
    {NULL, NULL, 0, NULL},
};

/* --- the unpack hook ---------------------------------------------------------------------- */

static PyObject *unpack(PyObject *Py_UNUSED(module), PyObject *packed_object) {
    if (Py_TYPE(packed_object) != &CountedSavedType) {
        return Py_NewRef(packed_object);
    }
    CountedSaved *packed = (CountedSaved *)packed_object;
    PyObject *tensor = CountedSaved_tensor(packed, NULL);
    if (tensor == NULL) {
        return NULL;
    }
    if (packed->had_grad_fn) { /* a kept non-leaf detached in place: PyTorch refuses it */
        PyObject *grad_fn = PyObject_GetAttr(tensor, S_grad_fn);
        int detached_in_place = grad_fn == Py_None;
        Py_XDECREF(grad_fn);
        if (grad_fn == NULL || detached_in_place) {
            if (detached_in_place) {
                PyErr_SetObject(PyExc_RuntimeError, DETACHED_MESSAGE);
            }
            Py_DECREF(tensor);
            return NULL;
        }
    }
    long long current;
    if (as_long_long(PyObject_GetAttr(tensor, S_version), &current) < 0) {
        Py_DECREF(tensor);
        return NULL;
    }
    if (current != packed->version) { /* PyTorch's own in-place error (trap 2) */
        PyObject *output_nr = packed->output_nr < 0 ? Py_NewRef(Py_None)
                                                    : PyLong_FromLong(packed->output_nr);
        PyObject *message = output_nr == NULL
                                ? NULL
                                : PyObject_CallFunction(
                                      VERSION_ERROR, "OOOLL", tensor,
                                      packed->grad_fn_name != NULL ? packed->grad_fn_name : Py_None,
                                      output_nr, current, packed->version);
        Py_XDECREF(output_nr);
        if (message != NULL) {
            PyErr_SetObject(PyExc_RuntimeError, message);
            Py_DECREF(message);
        }
        Py_DECREF(tensor);
        return NULL;
    }
    return tensor;
}

/* --- configure ---------------------------------------------------------------------------- */

static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs) {
    static char *names[] = {"pending",      "raise_pending", "may_own_saved", "unlisted_detach",
                            "profiler_enabled", "storage_of", "slots",      "version_error",
                            "detached_message", "parameter_type", "tensor_type", NULL};
    PyObject *pending, *raise_pending, *may_own, *unlisted, *profiler, *storage, *slots, *error,
        *message, *parameter, *tensor;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOOOUOO:configure", names, &PyDict_Type,
                                     &pending, &raise_pending, &may_own, &unlisted, &profiler,
                                     &storage, &slots, &error, &message, &parameter, &tensor)) {
        return NULL;
    }
    PyObject *hold = PyObject_GetAttrString(slots, "hold");
    PyObject *empty = PyObject_GetAttrString(slots, "_empty");
    PyObject *table = PyObject_GetAttrString(slots, "_table");
    PyObject *free_slots = PyObject_GetAttrString(slots, "_free");
    if (hold == NULL || empty == NULL || table == NULL || free_slots == NULL ||
        !PyList_Check(free_slots)) {
        Py_XDECREF(hold);
        Py_XDECREF(empty);
        Py_XDECREF(table);
        Py_XDECREF(free_slots);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "configure: slots._free must be a list");
        }
        return NULL;
    }
    Py_XSETREF(PENDING, Py_NewRef(pending));
    Py_XSETREF(RAISE_PENDING, Py_NewRef(raise_pending));
    Py_XSETREF(MAY_OWN_SAVED, Py_NewRef(may_own));
    Py_XSETREF(UNLISTED_DETACH, Py_NewRef(unlisted));
    Py_XSETREF(PROFILER_ENABLED, Py_NewRef(profiler));
    Py_XSETREF(STORAGE_OF, Py_NewRef(storage));
    Py_XSETREF(SLOTS_HOLD, hold);
    Py_XSETREF(EMPTY, empty);
    Py_XSETREF(SLOT_TABLE, table);
    Py_XSETREF(FREE_SLOTS, free_slots);
    Py_XSETREF(VERSION_ERROR, Py_NewRef(error));
    Py_XSETREF(DETACHED_MESSAGE, Py_NewRef(message));
    Py_XSETREF(PARAMETER_TYPE, Py_NewRef(parameter));
    Py_XSETREF(TENSOR_TYPE, Py_NewRef(tensor));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(...): the Python side of the rare cases (see recorder/counting.py)."},
    {"unpack", (PyCFunction)unpack, METH_O,
     "unpack(packed): a counted step's unpack hook (the saved tensor, checked as PyTorch does)."},
    {NULL, NULL, 0, NULL},
};

static int intern_all(void) {
    struct {
        PyObject **target;
        const char *text;
    } strings[] = {
        {&S_grad_fn, "grad_fn"},       {&S_sequence_nr, "_sequence_nr"},
        {&S_version, "_version"},      {&S_name, "name"},
        {&S_output_nr, "output_nr"},   {&S_is_view, "_is_view"},
        {&S_base, "_base"},            {&S_is_leaf, "is_leaf"},
        {&S_requires_grad, "requires_grad"}, {&S_dict, "__dict__"},
        {&S_untyped_storage, "untyped_storage"}, {&S_device, "device"},
        {&S_type, "type"},             {&S_data_ptr, "data_ptr"},
        {&S_nbytes, "nbytes"},         {&S_shape, "shape"},
        {&S_dtype, "dtype"},           {&S_detach, "detach"},
        {&HELD_PARAMETER, "parameter"}, {&HELD_USER, "user tensor"},
        {&HELD_NONE, ""},              {&META, "meta"},
    };
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        *strings[i].target = PyUnicode_InternFromString(strings[i].text);
        if (*strings[i].target == NULL) {
            return -1;
        }
    }
    DEVICE_TYPES = PyDict_New();
    return DEVICE_TYPES == NULL ? -1 : 0;
}

static int exec_module(PyObject *module) {
    PackerType.tp_methods = Packer_methods;
    if (intern_all() < 0 || PyType_Ready(&PackerType) < 0 ||
        PyType_Ready(&CountedSavedType) < 0 || PyType_Ready(&RootTagType) < 0) {
        return -1;
    }
    Py_INCREF(&PackerType);
    if (PyModule_AddObject(module, "Packer", (PyObject *)&PackerType) < 0) {
        Py_DECREF(&PackerType);
        return -1;
    }
    Py_INCREF(&CountedSavedType);
    if (PyModule_AddObject(module, "CountedSaved", (PyObject *)&CountedSavedType) < 0) {
        Py_DECREF(&CountedSavedType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, (void *)exec_module}, {0, NULL}};

static struct PyModuleDef counted_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "autograd_magic._counted",
    .m_doc = "Watch mode's per-saved-tensor work, compiled (see recorder/counting.py).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__counted(void) { return PyModuleDef_Init(&counted_module); }
