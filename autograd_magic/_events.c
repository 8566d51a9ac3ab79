/* autograd_magic._native.EventWriter and PackedBase: the writer's most frequent events, compiled.
 *
 * `EventWriter` is the base of the compiled recorder's writer (recorder/writer.py). It keeps the
 * writer's per-event state in C fields, which Python reads and writes as attributes of the same
 * names (the open timeline run, the event kind and line of the last sample, the record indexes),
 * and implements without a Python frame the events that come once per node and per saved tensor:
 * a node's death, a saved buffer's release, a timeline sample and the flush of its run.
 * `recorder/events.py` is the pure-Python reference of each method; tests/test_native.py checks
 * that both write the same Trace.
 *
 * A node tag's death (`events_node_died`, from _native.c) and a packed buffer's death
 * (`PackedBase`'s finalizer) reach these from C: no frame of ours runs, so an interrupt can land
 * only in a callback (the site lookup of a file not seen before, the timeline's thinning). What
 * fails there is handled as our Python finalizers handle it: an error is dropped, an interrupt
 * held for the block's next torch call (`deferred.hold`).
 *
 * The Trace's counters stay attributes of the Trace (read and written here by name), so every
 * reader sees them current while the block runs, as with the pure-Python writer.
 */
#include "_native.h"
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *trace;
    PyObject *locate;          /* locate(skip) -> Site, or None */
    PyObject *active_backward; /* the BackwardCall running, or None */
    PyObject *untrack;         /* None: records stay tracked by the cycle collector */
    PyObject *nodes;           /* node id -> NodeRecord */
    PyObject *buffers;         /* buffer id -> SavedBuffer */
    PyObject *storage_counts;  /* storage key -> live saved buffers on it */
    PyObject *storage_bytes;   /* storage key -> its bytes */
    PyObject *held_by;         /* storage key -> who else holds it */
    PyObject *new_storages;    /* storage key -> sequence number of its first saving */
    PyObject *last_what;       /* the latest sample's event kind and line */
    PyObject *last_line;
    PyObject *new_tag; /* new_tag(tag_ref, node_id) -> the tag stored in a new node's metadata */
    PyObject *tag_ref; /* a weak reference to this writer */
    long long next_node_id;
    long long live_buffers;
    long long run_seq, run_live, run_bytes; /* the open run's numbers (see `sample`) */
    long long timeline_stride;
    char closed;
    char run_open;
} EventWriter;

static PyObject *SAMPLE_TYPE;  /* model.records.TimelineSample */
static PyObject *UNKNOWN_SITE; /* model.records.UNKNOWN_SITE */
static PyObject *HOLD;         /* recorder.deferred.hold */
static PyObject *NODE_RECORD;  /* model.records.NodeRecord */
static PyObject *S_seq, *S_live_nodes, *S_retained_bytes, *S_timeline, *S_max_timeline, *S_site,
    *S_line, *S_outer_line, *S_freed_seq, *S_freed_site, *S_released_bytes, *S_released_buffers,
    *S_thin, *S_next_functions, *S_metadata, *S_name, *S_nodes, *S_max_records, *S_nodes_created,
    *S_peak_live_nodes, *S_dropped_nodes, *S_module, *MODULE_KWNAMES, *NODES_CREATED, *NODE_FREED,
    *BUFFER_RELEASED;

#define OR_NONE(p) ((p) != NULL ? (p) : Py_None)

static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *obj, PyObject *name, long long value) {
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    int result = PyObject_SetAttr(obj, name, number);
    Py_DECREF(number);
    return result;
}

/* obj.name += delta; the new value in *out. */
static int add_ll(PyObject *obj, PyObject *name, long long delta, long long *out) {
    long long value;
    if (get_ll(obj, name, &value) < 0) {
        return -1;
    }
    *out = value + delta;
    return set_ll(obj, name, *out);
}

/* Python's `a == b` (None included) for the last sample's kind and line. */
static int equal(PyObject *a, PyObject *b) {
    a = OR_NONE(a);
    b = OR_NONE(b);
    return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The traced code's own line of a site: `outer_line`, else `line`. */
static PyObject *site_line(PyObject *site) {
    PyObject *line = PyObject_GetAttr(site, S_outer_line);
    if (line == Py_None) {
        Py_DECREF(line);
        line = PyObject_GetAttr(site, S_line);
    }
    return line;
}

/* TimelineSample(seq, live, bytes, what, line), made as `tuple.__new__` makes it. */
static PyObject *new_sample(EventWriter *self, long long seq, long long live, long long bytes,
                            PyObject *what, PyObject *line) {
    PyTypeObject *type = (PyTypeObject *)SAMPLE_TYPE;
    PyObject *items[3] = {PyLong_FromLongLong(seq), PyLong_FromLongLong(live),
                          PyLong_FromLongLong(bytes)};
    PyObject *sample = NULL;
    if (items[0] != NULL && items[1] != NULL && items[2] != NULL) {
        sample = type->tp_alloc(type, 5);
    }
    if (sample == NULL) {
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
        Py_XDECREF(items[2]);
        return NULL;
    }
    PyTuple_SET_ITEM(sample, 0, items[0]);
    PyTuple_SET_ITEM(sample, 1, items[1]);
    PyTuple_SET_ITEM(sample, 2, items[2]);
    PyTuple_SET_ITEM(sample, 3, Py_NewRef(what));
    PyTuple_SET_ITEM(sample, 4, Py_NewRef(line));
    if (OR_NONE(self->untrack) != Py_None && PyObject_GC_IsTracked(sample)) {
        PyObject_GC_UnTrack(sample);
    }
    return sample;
}

static PyObject *timeline_of(EventWriter *self) {
    PyObject *timeline = PyObject_GetAttr(self->trace, S_timeline);
    if (timeline != NULL && !PyList_Check(timeline)) {
        Py_DECREF(timeline);
        PyErr_SetString(PyExc_TypeError, "trace.timeline must be a list");
        return NULL;
    }
    return timeline;
}

/* `events.EventWriting.flush`. */
static int flush_impl(EventWriter *self) {
    if (!self->run_open) {
        return 0;
    }
    PyObject *timeline = timeline_of(self);
    if (timeline == NULL) {
        return -1;
    }
    Py_ssize_t size = PyList_GET_SIZE(timeline);
    int result = 0;
    if (size == 0) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        result = -1;
    } else {
        PyObject *last = PyList_GET_ITEM(timeline, size - 1);
        PyObject *what = PySequence_GetItem(last, 3), *line = PySequence_GetItem(last, 4);
        PyObject *sample = NULL;
        if (what != NULL && line != NULL) {
            sample =
                new_sample(self, self->run_seq, self->run_live, self->run_bytes, what, line);
        }
        Py_XDECREF(what);
        Py_XDECREF(line);
        if (sample == NULL) {
            result = -1;
        } else {
            PyList_SetItem(timeline, size - 1, sample); /* steals `sample` */
            self->run_open = 0;
        }
    }
    Py_DECREF(timeline);
    return result;
}

/* The open run goes on: the state now is its sample's. */
static int continue_run(EventWriter *self, long long seq, long long live) {
    long long bytes;
    if (get_ll(self->trace, S_retained_bytes, &bytes) < 0) {
        return -1;
    }
    self->run_seq = seq;
    self->run_live = live;
    self->run_bytes = bytes;
    self->run_open = 1;
    return 0;
}

/* `events.EventWriting.sample`, with the site's line already read. */
static int sample_at(EventWriter *self, PyObject *what, PyObject *line, int force) {
    PyObject *trace = self->trace;
    long long seq, live, bytes;
    if (get_ll(trace, S_seq, &seq) < 0) {
        return -1;
    }
    if (!force) {
        int same = equal(what, self->last_what);
        if (same > 0) {
            same = equal(line, self->last_line);
        }
        if (same < 0) {
            return -1;
        }
        if (same) {
            return get_ll(trace, S_live_nodes, &live) < 0 ? -1 : continue_run(self, seq, live);
        }
        if (self->timeline_stride > 1 && seq % self->timeline_stride) {
            return 0;
        }
    }
    if (flush_impl(self) < 0 || get_ll(trace, S_live_nodes, &live) < 0 ||
        get_ll(trace, S_retained_bytes, &bytes) < 0) {
        return -1;
    }
    PyObject *sample = new_sample(self, seq, live, bytes, what, line);
    if (sample == NULL) {
        return -1;
    }
    PyObject *timeline = timeline_of(self);
    if (timeline == NULL || PyList_Append(timeline, sample) < 0) {
        Py_XDECREF(timeline);
        Py_DECREF(sample);
        return -1;
    }
    Py_DECREF(sample);
    Py_XSETREF(self->last_what, Py_NewRef(what));
    Py_XSETREF(self->last_line, Py_NewRef(line));
    Py_ssize_t size = PyList_GET_SIZE(timeline);
    Py_DECREF(timeline);
    long long cap;
    if (get_ll(trace, S_max_timeline, &cap) < 0) {
        return -1;
    }
    if (size >= cap) {
        PyObject *done = PyObject_CallMethodNoArgs((PyObject *)self, S_thin);
        if (done == NULL) {
            return -1;
        }
        Py_DECREF(done);
    }
    return 0;
}

static int sample_impl(EventWriter *self, PyObject *what, PyObject *site, int force) {
    PyObject *line = site_line(site);
    if (line == NULL) {
        return -1;
    }
    int result = sample_at(self, what, line, force);
    Py_DECREF(line);
    return result;
}

/* What a Python finalizer of ours does with what escapes it: an error is dropped, an interrupt
 * (KeyboardInterrupt, SystemExit) is held for the block's next torch call. */
static void hold_or_drop(void) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (type != NULL && !PyErr_GivenExceptionMatches(type, PyExc_Exception) && HOLD != NULL &&
        value != NULL) {
        PyObject *held = PyObject_CallOneArg(HOLD, value);
        if (held == NULL) {
            PyErr_Clear();
        }
        Py_XDECREF(held);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
}

/* Where an event with no site of its own happened: the running backward call's site, else the
 * user's frame `skip` frames above the innermost Python frame. */
static PyObject *event_site(EventWriter *self, long skip) {
    PyObject *call = OR_NONE(self->active_backward);
    if (call != Py_None) {
        return PyObject_GetAttr(call, S_site);
    }
    PyObject *locate = OR_NONE(self->locate);
    if (locate == Py_None) {
        return Py_NewRef(UNKNOWN_SITE);
    }
    PyObject *arg = PyLong_FromLong(skip);
    if (arg == NULL) {
        return NULL;
    }
    PyObject *site = PyObject_CallOneArg(locate, arg);
    if (site == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) {
        /* An interrupt landed in the lookup (its Python part: a file not seen before). It is
         * held for the block's next torch call, and the lookup done again, so the event is
         * recorded as if it had come a moment later. */
        hold_or_drop();
        site = PyObject_CallOneArg(locate, arg);
    }
    Py_DECREF(arg);
    return site;
}

/* Sets freed_seq and freed_site on the record `index[key]`, if there is one. */
static int mark_freed(PyObject *index, PyObject *key, long long seq, PyObject *site) {
    PyObject *record = PyDict_GetItemWithError(index, key); /* borrowed */
    if (record == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(record);
    int result = set_ll(record, S_freed_seq, seq);
    if (result == 0) {
        result = PyObject_SetAttr(record, S_freed_site, site);
    }
    Py_DECREF(record);
    return result;
}

/* `events.EventWriting.node_died`; `skip` as for `locate`. */
static int node_died_impl(EventWriter *self, PyObject *node_id, long skip) {
    if (self->closed) {
        return 0;
    }
    PyObject *trace = self->trace;
    PyObject *site = event_site(self, skip + 1);
    if (site == NULL) {
        return -1;
    }
    PyObject *line = NULL;
    long long live, seq;
    int result = -1;
    if (add_ll(trace, S_live_nodes, -1, &live) < 0 || add_ll(trace, S_seq, 1, &seq) < 0 ||
        !PyDict_Check(OR_NONE(self->nodes)) || mark_freed(self->nodes, node_id, seq, site) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "the writer's node index must be a dict");
        }
        goto done;
    }
    line = site_line(site);
    if (line == NULL) {
        goto done;
    }
    int same = equal(line, self->last_line);
    if (same > 0) {
        same = equal(self->last_what, NODE_FREED);
    }
    if (same < 0) {
        goto done;
    }
    result = same ? continue_run(self, seq, live) : sample_at(self, NODE_FREED, line, 0);
done:
    Py_XDECREF(line);
    Py_DECREF(site);
    return result;
}

/* `events.EventWriting.buffer_released`; `skip` as for `locate`. */
static int buffer_released_impl(EventWriter *self, PyObject *buffer_id, PyObject *storage_key,
                                long skip) {
    if (self->closed) {
        return 0;
    }
    PyObject *trace = self->trace;
    PyObject *call = OR_NONE(self->active_backward);
    PyObject *site = event_site(self, skip + 1);
    if (site == NULL) {
        return -1;
    }
    self->live_buffers -= 1;
    int result = -1;
    long long seq, ignored;
    PyObject *counts = OR_NONE(self->storage_counts), *sizes = OR_NONE(self->storage_bytes);
    PyObject *held = OR_NONE(self->held_by), *fresh = OR_NONE(self->new_storages);
    if (!PyDict_Check(counts) || !PyDict_Check(sizes) || !PyDict_Check(held) ||
        !PyDict_Check(fresh) || !PyDict_Check(OR_NONE(self->buffers))) {
        PyErr_SetString(PyExc_TypeError, "the writer's storage indexes must be dicts");
        goto done;
    }
    PyObject *count = PyDict_GetItemWithError(counts, storage_key); /* borrowed */
    if (count == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (count != NULL) {
        long long n = PyLong_AsLongLong(count);
        if (n == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (n == 1) {
            PyObject *nbytes = PyDict_GetItemWithError(sizes, storage_key);
            if (nbytes == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_SetObject(PyExc_KeyError, storage_key);
                }
                goto done;
            }
            long long released = PyLong_AsLongLong(nbytes);
            if ((released == -1 && PyErr_Occurred()) || PyDict_DelItem(counts, storage_key) < 0 ||
                PyDict_DelItem(sizes, storage_key) < 0) {
                goto done;
            }
            int was_new = PyDict_Contains(fresh, storage_key);
            int was_held = PyDict_Contains(held, storage_key);
            if (was_new < 0 || was_held < 0 || (was_new && PyDict_DelItem(fresh, storage_key) < 0)) {
                goto done;
            }
            if (was_held) {
                if (PyDict_DelItem(held, storage_key) < 0) {
                    goto done;
                }
            } else {
                if (add_ll(trace, S_retained_bytes, -released, &ignored) < 0) {
                    goto done;
                }
                if (call != Py_None && add_ll(call, S_released_bytes, released, &ignored) < 0) {
                    goto done;
                }
            }
        } else {
            PyObject *less = PyLong_FromLongLong(n - 1);
            if (less == NULL || PyDict_SetItem(counts, storage_key, less) < 0) {
                Py_XDECREF(less);
                goto done;
            }
            Py_DECREF(less);
        }
    }
    if (add_ll(trace, S_seq, 1, &seq) < 0 || mark_freed(self->buffers, buffer_id, seq, site) < 0) {
        goto done;
    }
    if (call != Py_None && add_ll(call, S_released_buffers, 1, &ignored) < 0) {
        goto done;
    }
    result = sample_impl(self, BUFFER_RELEASED, site, 0);
done:
    Py_DECREF(site);
    return result;
}

void events_node_died(PyObject *writer, long long node_id) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* a death may come while an error is being raised */
    Py_INCREF(writer);
    PyObject *id = PyLong_FromLongLong(node_id);
    /* skip -1: no frame of ours is on the stack, the innermost one is where the node died */
    if (id == NULL || node_died_impl((EventWriter *)writer, id, -1) < 0) {
        hold_or_drop();
    }
    Py_XDECREF(id);
    Py_DECREF(writer);
    PyErr_Restore(type, value, traceback);
}

/* ----- births ------------------------------------------------------------------------ */

/* `events.EventWriting.op_node`: `node_id` (an int) is the new node of an op. */
static int op_node_impl(EventWriter *self, PyObject *node_id, PyObject *name, PyObject *site,
                        PyObject *next_ids) {
    PyObject *trace = self->trace;
    long long seq, live, peak, made, cap, ignored;
    if (add_ll(trace, S_seq, 1, &seq) < 0 || add_ll(trace, S_nodes_created, 1, &made) < 0 ||
        add_ll(trace, S_live_nodes, 1, &live) < 0 || get_ll(trace, S_peak_live_nodes, &peak) < 0 ||
        (live > peak && set_ll(trace, S_peak_live_nodes, live) < 0) ||
        get_ll(trace, S_max_records, &cap) < 0) {
        return -1;
    }
    PyObject *nodes = PyObject_GetAttr(trace, S_nodes);
    if (nodes == NULL) {
        return -1;
    }
    Py_ssize_t kept = PyObject_Size(nodes);
    int result = -1;
    if (kept < 0) {
        goto done;
    }
    if (kept < cap) {
        PyObject *module = PyObject_GetAttr((PyObject *)self, S_module);
        PyObject *born = PyLong_FromLongLong(seq);
        PyObject *record = NULL;
        if (module != NULL && born != NULL) {
            PyObject *argv[6] = {node_id, name, born, site, next_ids, module};
            record = PyObject_Vectorcall(NODE_RECORD, argv, 5, MODULE_KWNAMES);
        }
        Py_XDECREF(module);
        Py_XDECREF(born);
        if (record == NULL) {
            goto done;
        }
        if (OR_NONE(self->untrack) != Py_None && PyObject_GC_IsTracked(record)) {
            PyObject_GC_UnTrack(record);
        }
        int failed = PyList_Check(nodes) ? PyList_Append(nodes, record) : -1;
        if (failed == 0) {
            failed = PyDict_Check(OR_NONE(self->nodes))
                         ? PyDict_SetItem(self->nodes, node_id, record)
                         : -1;
        }
        Py_DECREF(record);
        if (failed < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "trace.nodes and the node index: a list, a dict");
            }
            goto done;
        }
    } else if (add_ll(trace, S_dropped_nodes, 1, &ignored) < 0) {
        goto done;
    }
    PyObject *line = site_line(site);
    if (line == NULL) {
        goto done;
    }
    int same = equal(line, self->last_line);
    if (same > 0) {
        same = equal(self->last_what, NODES_CREATED);
    }
    if (same >= 0) {
        result = same ? continue_run(self, seq, live) : sample_at(self, NODES_CREATED, line, 0);
    }
    Py_DECREF(line);
done:
    Py_DECREF(nodes);
    return result;
}

/* The id in a tag (`tag[1]`): read from the compiled tag's field or by index. */
static PyObject *tag_node_id(PyObject *tag) { return PySequence_GetItem(tag, 1); }

/* `events.EventWriting.born_alone`; the Python caller is the recorder's per-op path. */
static PyObject *EventWriter_born_alone(EventWriter *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "born_alone(node, metadata, key, site)");
        return NULL;
    }
    PyObject *node = args[0], *metadata = args[1], *key = args[2], *site = args[3];
    PyObject *children = PyObject_GetAttr(node, S_next_functions);
    if (children == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *ids = PyList_New(0), *next_ids = NULL, *node_id = NULL;
    PyObject *tag = NULL, *name = NULL;
    Py_INCREF(site);
    if (ids == NULL || !PyTuple_Check(children)) {
        if (ids != NULL) {
            PyErr_SetString(PyExc_TypeError, "next_functions must be a tuple");
        }
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(children); i++) {
        PyObject *edge = PyTuple_GET_ITEM(children, i);
        PyObject *child = PyTuple_Check(edge) && PyTuple_GET_SIZE(edge) > 0
                              ? Py_NewRef(PyTuple_GET_ITEM(edge, 0))
                              : PySequence_GetItem(edge, 0);
        if (child == NULL) {
            goto done;
        }
        if (child == Py_None) {
            Py_DECREF(child);
            continue;
        }
        PyObject *child_metadata = PyObject_GetAttr(child, S_metadata);
        Py_DECREF(child);
        if (child_metadata == NULL) {
            goto done;
        }
        PyObject *child_tag = PyDict_Check(child_metadata)
                                  ? Py_XNewRef(PyDict_GetItemWithError(child_metadata, key))
                                  : PyObject_CallMethod(child_metadata, "get", "O", key);
        Py_DECREF(child_metadata);
        if (child_tag == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (child_tag == NULL || child_tag == Py_None) {
            Py_XDECREF(child_tag);
            result = Py_NewRef(Py_None); /* an input's node is new too: a walk finds them */
            goto done;
        }
        PyObject *id = tag_node_id(child_tag);
        Py_DECREF(child_tag);
        if (id == NULL || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            goto done;
        }
        Py_DECREF(id);
    }
    node_id = PyLong_FromLongLong(self->next_node_id);
    if (node_id == NULL) {
        goto done;
    }
    self->next_node_id += 1;
    PyObject *tag_args[2] = {OR_NONE(self->tag_ref), node_id};
    tag = PyObject_Vectorcall(OR_NONE(self->new_tag), tag_args, 2, NULL);
    if (tag == NULL || PyObject_SetItem(metadata, key, tag) < 0) {
        goto done;
    }
    if (site == Py_None) {
        PyObject *locate = OR_NONE(self->locate);
        Py_DECREF(site);
        if (locate == Py_None) {
            site = Py_NewRef(UNKNOWN_SITE);
        } else {
            /* the recorder's per-op frame and the mode's are ours: the user's is above them */
            PyObject *skip = PyLong_FromLong(2);
            site = skip == NULL ? NULL : PyObject_CallOneArg(locate, skip);
            Py_XDECREF(skip);
        }
        if (site == NULL) {
            goto done;
        }
    }
    name = PyObject_GetAttr((PyObject *)Py_TYPE(node), S_name);
    next_ids = name == NULL ? NULL : PyList_AsTuple(ids);
    if (next_ids != NULL && op_node_impl(self, node_id, name, site, next_ids) == 0) {
        result = Py_NewRef(node_id);
    }
done:
    Py_XDECREF(site);
    Py_XDECREF(name);
    Py_XDECREF(tag);
    Py_XDECREF(node_id);
    Py_XDECREF(next_ids);
    Py_XDECREF(ids);
    Py_DECREF(children);
    return result;
}

static PyObject *EventWriter_op_node(EventWriter *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "op_node(node_id, name, site, next_ids)");
        return NULL;
    }
    return op_node_impl(self, args[0], args[1], args[2], args[3]) < 0 ? NULL : Py_NewRef(Py_None);
}

/* ----- the Python-facing methods (called from a Python frame: skip 0 steps over it) ------ */

static PyObject *EventWriter_node_died(EventWriter *self, PyObject *node_id) {
    return node_died_impl(self, node_id, 0) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *EventWriter_buffer_released(EventWriter *self, PyObject *const *args,
                                             Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "buffer_released(buffer_id, storage_key)");
        return NULL;
    }
    return buffer_released_impl(self, args[0], args[1], 0) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *EventWriter_sample(EventWriter *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames) {
    Py_ssize_t given = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *force = nargs > 2 ? args[2] : Py_False;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 1 && nargs == 2 &&
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "force") == 0) {
        force = args[2];
    } else if (kwnames != NULL || nargs < 2 || given > 3) {
        PyErr_SetString(PyExc_TypeError, "sample(what, site, force=False)");
        return NULL;
    }
    int forced = PyObject_IsTrue(force);
    if (forced < 0 || sample_impl(self, args[0], args[1], forced) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *EventWriter_flush(EventWriter *self, PyObject *Py_UNUSED(ignored)) {
    return flush_impl(self) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyMethodDef EventWriter_methods[] = {
    {"born_alone", (PyCFunction)(void (*)(void))EventWriter_born_alone, METH_FASTCALL,
     "The common op's node, if new and born alone (see recorder/events.py)."},
    {"op_node", (PyCFunction)(void (*)(void))EventWriter_op_node, METH_FASTCALL,
     "The node an op just made (see recorder/events.py)."},
    {"node_died", (PyCFunction)EventWriter_node_died, METH_O,
     "A tagged node was destroyed (see recorder/events.py)."},
    {"buffer_released", (PyCFunction)(void (*)(void))EventWriter_buffer_released, METH_FASTCALL,
     "Autograd let go of a saved buffer (see recorder/events.py)."},
    {"sample", (PyCFunction)(void (*)(void))EventWriter_sample, METH_FASTCALL | METH_KEYWORDS,
     "Record the state after an event (see recorder/events.py)."},
    {"flush", (PyCFunction)EventWriter_flush, METH_NOARGS,
     "Write the open run's numbers into its sample."},
    {NULL, NULL, 0, NULL},
};

#define OBJECT_MEMBER(name, field) {name, T_OBJECT, offsetof(EventWriter, field), 0, NULL}
#define NUMBER_MEMBER(name, field) {name, T_LONGLONG, offsetof(EventWriter, field), 0, NULL}

static PyMemberDef EventWriter_members[] = {
    OBJECT_MEMBER("trace", trace),
    OBJECT_MEMBER("locate", locate),
    OBJECT_MEMBER("active_backward", active_backward),
    OBJECT_MEMBER("untrack", untrack),
    OBJECT_MEMBER("_nodes", nodes),
    OBJECT_MEMBER("_buffers", buffers),
    OBJECT_MEMBER("_storage_counts", storage_counts),
    OBJECT_MEMBER("_storage_bytes", storage_bytes),
    OBJECT_MEMBER("held_by", held_by),
    OBJECT_MEMBER("new_storages", new_storages),
    OBJECT_MEMBER("_last_what", last_what),
    OBJECT_MEMBER("_last_line", last_line),
    OBJECT_MEMBER("new_tag", new_tag),
    OBJECT_MEMBER("tag_ref", tag_ref),
    NUMBER_MEMBER("next_node_id", next_node_id),
    NUMBER_MEMBER("live_buffers", live_buffers),
    NUMBER_MEMBER("_run_seq", run_seq),
    NUMBER_MEMBER("_run_live", run_live),
    NUMBER_MEMBER("_run_bytes", run_bytes),
    NUMBER_MEMBER("_timeline_stride", timeline_stride),
    {"closed", T_BOOL, offsetof(EventWriter, closed), 0, NULL},
    {"_run_open", T_BOOL, offsetof(EventWriter, run_open), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

#define EACH_OBJECT(DO)                                                                        \
    DO(trace) DO(locate) DO(active_backward) DO(untrack) DO(nodes) DO(buffers)                 \
    DO(storage_counts) DO(storage_bytes) DO(held_by) DO(new_storages) DO(last_what)            \
    DO(last_line) DO(new_tag) DO(tag_ref)

static PyObject *EventWriter_new(PyTypeObject *type, PyObject *Py_UNUSED(args),
                                 PyObject *Py_UNUSED(kwargs)) {
    EventWriter *self = (EventWriter *)type->tp_alloc(type, 0);
    if (self != NULL) {
#define SET_NONE(field) self->field = Py_NewRef(Py_None);
        EACH_OBJECT(SET_NONE)
#undef SET_NONE
        self->timeline_stride = 1;
        self->next_node_id = 1;
    }
    return (PyObject *)self;
}

static int EventWriter_traverse(EventWriter *self, visitproc visit, void *arg) {
#define VISIT(field) Py_VISIT(self->field);
    EACH_OBJECT(VISIT)
#undef VISIT
    return 0;
}

static int EventWriter_clear(EventWriter *self) {
#define CLEAR(field) Py_CLEAR(self->field);
    EACH_OBJECT(CLEAR)
#undef CLEAR
    return 0;
}

static void EventWriter_dealloc(EventWriter *self) {
    PyObject_GC_UnTrack(self);
    EventWriter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject EventWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._native.EventWriter",
    .tp_basicsize = sizeof(EventWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled base of the recorder's TraceWriter: its per-event state and methods.",
    .tp_new = EventWriter_new,
    .tp_dealloc = (destructor)EventWriter_dealloc,
    .tp_traverse = (traverseproc)EventWriter_traverse,
    .tp_clear = (inquiry)EventWriter_clear,
    .tp_methods = EventWriter_methods,
    .tp_members = EventWriter_members,
};

/* PackedBase: the compiled base of `saved.PackedSaved` where the extension is in use. Its
 * fields are the three its death needs; the death itself (a saved buffer released) is recorded
 * by its finalizer, without a Python frame. */
typedef struct {
    PyObject_HEAD
    PyObject *writer_ref; /* weakref to the block's writer */
    PyObject *buffer_id;
    PyObject *storage_key;
} PackedBase;

/* Runs first in the Python subclass's dealloc (before its slots are cleared), as the pure-Python
 * `__del__` does: dropping the saved tensor slot can free its producer node, whose death must
 * come after this release, as it does with the Python recorder. */
static void PackedBase_finalize(PackedBase *self) {
    PyObject *ref = self->writer_ref;
    if (ref == NULL || !PyWeakref_CheckRef(ref) || self->buffer_id == NULL ||
        self->storage_key == NULL) {
        return;
    }
    PyObject *writer = PyWeakref_GetObject(ref); /* borrowed */
    if (writer == Py_None || !PyObject_TypeCheck(writer, &EventWriterType)) {
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    Py_INCREF(writer);
    if (buffer_released_impl((EventWriter *)writer, self->buffer_id, self->storage_key, -1) < 0) {
        hold_or_drop();
    }
    Py_DECREF(writer);
    PyErr_Restore(type, value, traceback);
}

static void PackedBase_dealloc(PackedBase *self) {
    Py_CLEAR(self->writer_ref);
    Py_CLEAR(self->buffer_id);
    Py_CLEAR(self->storage_key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef PackedBase_members[] = {
    {"writer_ref", T_OBJECT, offsetof(PackedBase, writer_ref), 0, NULL},
    {"buffer_id", T_OBJECT, offsetof(PackedBase, buffer_id), 0, NULL},
    {"storage_key", T_OBJECT, offsetof(PackedBase, storage_key), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PackedBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_magic._native.PackedBase",
    .tp_basicsize = sizeof(PackedBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The compiled base of a packed saved tensor: its death records the release.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)PackedBase_dealloc,
    .tp_finalize = (destructor)PackedBase_finalize,
    .tp_members = PackedBase_members,
};

static PyObject *set_event_context(PyObject *Py_UNUSED(module), PyObject *const *args,
                                   Py_ssize_t nargs) {
    if (nargs != 4 || !PyType_Check(args[0]) ||
        !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "set_event_context(sample_type: a tuple subclass, unknown_site, hold, "
                        "node_record_type)");
        return NULL;
    }
    Py_XSETREF(SAMPLE_TYPE, Py_NewRef(args[0]));
    Py_XSETREF(UNKNOWN_SITE, Py_NewRef(args[1]));
    Py_XSETREF(HOLD, Py_NewRef(args[2]));
    Py_XSETREF(NODE_RECORD, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

static PyMethodDef events_functions[] = {
    {"set_event_context", (PyCFunction)(void (*)(void))set_event_context, METH_FASTCALL,
     "set_event_context(TimelineSample, UNKNOWN_SITE, deferred.hold, NodeRecord): what the events "
     "need."},
    {NULL, NULL, 0, NULL},
};

static int intern_all(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&S_seq, "seq"},
        {&S_live_nodes, "live_nodes"},
        {&S_retained_bytes, "retained_bytes"},
        {&S_timeline, "timeline"},
        {&S_max_timeline, "max_timeline"},
        {&S_site, "site"},
        {&S_line, "line"},
        {&S_outer_line, "outer_line"},
        {&S_freed_seq, "freed_seq"},
        {&S_freed_site, "freed_site"},
        {&S_released_bytes, "released_bytes"},
        {&S_released_buffers, "released_buffers"},
        {&S_thin, "_thin_timeline"},
        {&S_next_functions, "next_functions"},
        {&S_metadata, "metadata"},
        {&S_name, "__name__"},
        {&S_nodes, "nodes"},
        {&S_max_records, "max_records"},
        {&S_nodes_created, "nodes_created"},
        {&S_peak_live_nodes, "peak_live_nodes"},
        {&S_dropped_nodes, "dropped_nodes"},
        {&S_module, "module"},
        {&NODES_CREATED, "nodes created"},
        {&NODE_FREED, "node freed"},
        {&BUFFER_RELEASED, "buffer released"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) {
            return -1;
        }
    }
    MODULE_KWNAMES = PyTuple_Pack(1, S_module);
    return MODULE_KWNAMES == NULL ? -1 : 0;
}

int events_add_types(PyObject *module) {
    if (intern_all() < 0 || PyType_Ready(&EventWriterType) < 0 ||
        PyType_Ready(&PackedBaseType) < 0 || PyModule_AddFunctions(module, events_functions) < 0) {
        return -1;
    }
    Py_INCREF(&EventWriterType);
    if (PyModule_AddObject(module, "EventWriter", (PyObject *)&EventWriterType) < 0) {
        Py_DECREF(&EventWriterType);
        return -1;
    }
    Py_INCREF(&PackedBaseType);
    if (PyModule_AddObject(module, "PackedBase", (PyObject *)&PackedBaseType) < 0) {
        Py_DECREF(&PackedBaseType);
        return -1;
    }
    return 0;
}
