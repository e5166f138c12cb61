# Result building (included by _query.pyx): resolved hits into per-query lists of Match objects
# or tuples; apart as the only part that holds the GIL and makes a Python object per hit.


cdef extern from *:
    """
    /* A 4-tuple of a tuple subclass without fields of its own (the Match namedtuple): what
       tuple.__new__(cls, (a, b, c, d)) makes, without the method lookup and the tuple in
       between. tp_alloc returns it zeroed and tracked; its items are set before any use. */
    static PyObject *si_tuple4(PyObject *cls, PyObject *a, PyObject *b, PyObject *c,
                               PyObject *d) {
        PyTypeObject *t = (PyTypeObject *)cls;
        PyObject *o = t->tp_alloc(t, 4);
        if (o == NULL) return NULL;
        Py_INCREF(a); PyTuple_SET_ITEM(o, 0, a);
        Py_INCREF(b); PyTuple_SET_ITEM(o, 1, b);
        Py_INCREF(c); PyTuple_SET_ITEM(o, 2, c);
        Py_INCREF(d); PyTuple_SET_ITEM(o, 3, d);
        /* of atomic items only (an int or str id, a None meta) it can hold no cycle: the
           collector would untrack it at its first pass; untracked now, the collections
           that a big batch's matches trigger need not traverse it */
        if (!PyObject_GC_IsTracked(a) && !PyObject_GC_IsTracked(b) &&
                !PyObject_GC_IsTracked(c) && !PyObject_GC_IsTracked(d))
            PyObject_GC_UnTrack(o);
        return o;
    }

    /* The Match of a plain hit (an integer id, a None meta; see record_plain_int), made
       from the values the query found without the GIL: the record is not read again. */
    static PyObject *si_match_plain(PyObject *cls, unsigned long long id,
                                    unsigned long long fp, long dist) {
        PyTypeObject *t = (PyTypeObject *)cls;
        PyObject *a, *b, *c, *o;
        a = PyLong_FromUnsignedLongLong(id);
        if (a == NULL) return NULL;
        b = PyLong_FromUnsignedLongLong(fp);
        if (b == NULL) { Py_DECREF(a); return NULL; }
        c = PyLong_FromLong(dist);
        if (c == NULL) { Py_DECREF(a); Py_DECREF(b); return NULL; }
        o = t->tp_alloc(t, 4);
        if (o == NULL) { Py_DECREF(a); Py_DECREF(b); Py_DECREF(c); return NULL; }
        PyTuple_SET_ITEM(o, 0, a);
        PyTuple_SET_ITEM(o, 1, b);
        PyTuple_SET_ITEM(o, 2, c);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(o, 3, Py_None);
        PyObject_GC_UnTrack(o);      /* of atomic items only: see si_tuple4 */
        return o;
    }
    """
    object si_tuple4(object cls, object a, object b, object c, object d)
    object si_match_plain(object cls, unsigned long long id, unsigned long long fp, long dist)
    int PyGC_Disable()
    int PyGC_Enable()


cdef list _hit_lists(HitBuf *hits, size_t *qstart, Py_ssize_t n, bint matches=False,
                     int words=1):
    """Per query, [(distance, fingerprint, seq, id, meta bytes or None), ...] of resolved
    hits; with `matches`, [Match(id, fingerprint, distance, meta), ...] instead."""
    global _gc_paused, _gc_was_on
    cdef object cls = _MATCH
    if matches and cls is None:
        raise RuntimeError("no match type registered (set_match_type)")
    if n > 1:
        # The lists and tuples made here hold no cycles, yet their allocations would run
        # the collector every 700 of them: 13% of a 40k batch's time, all under the GIL.
        if _gc_paused == 0:
            _gc_was_on = PyGC_Disable()
        _gc_paused += 1
        try:
            return _hit_lists_of(hits, qstart, n, matches, words, cls)
        finally:
            _gc_paused -= 1
            if _gc_paused == 0 and _gc_was_on:
                PyGC_Enable()
    return _hit_lists_of(hits, qstart, n, matches, words, cls)


cdef list _hit_lists_of(HitBuf *hits, size_t *qstart, Py_ssize_t n, bint matches, int words,
                        object cls):
    cdef Py_ssize_t qi, j
    cdef size_t r
    cdef Hit *hh
    cdef list out = PyList_New(n), lst
    cdef object m
    for qi in range(n):
        lst = PyList_New(<Py_ssize_t>(qstart[qi + 1] - qstart[qi]))
        Py_INCREF(lst)
        PyList_SET_ITEM(out, qi, lst)        # (steals the reference taken above)
        j = 0
        for r in range(qstart[qi], qstart[qi + 1]):
            hh = &hits.h[r]
            if matches and hh.plain:
                m = si_match_plain(cls, hh.id, hh.fp, hh.dist)
            else:
                id_, meta = record_id_meta(hh.val, hh.vlen, words)
                fp = hh.fp if words == 1 else record_fp(hh.val, words)
                if matches:
                    if meta is not None:
                        meta = _UNPACK(meta, "meta value")
                    m = si_tuple4(cls, id_, fp, hh.dist, meta)
                else:
                    m = (hh.dist, fp, hh.seq, id_, meta)
            Py_INCREF(m)
            PyList_SET_ITEM(lst, j, m)
            j += 1
    return out
