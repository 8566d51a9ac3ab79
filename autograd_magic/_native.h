/* What the two sources of autograd_magic._native share (see _native.c and _events.c). */
#ifndef AUTOGRAD_MAGIC_NATIVE_H
#define AUTOGRAD_MAGIC_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* _events.c: the writer's per-event base type and the packed saved tensor's base type. */
extern PyTypeObject EventWriterType;
int events_add_types(PyObject *module);
/* A tagged node died: `node_id` of the block whose writer is `writer` (an EventWriter). Never
 * raises: an error is dropped and an interrupt held (`deferred.hold`), as a finalizer does. */
void events_node_died(PyObject *writer, long long node_id);

#endif
