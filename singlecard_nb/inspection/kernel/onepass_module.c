/* onepass.c as a Python extension module: the same kernels, called in ~0.1 us instead of the
 * ~0.5 us a ctypes call with argument types takes (native.py builds this when Python's headers
 * are there, else loads onepass.c through ctypes). Each kernel is
 * float32(data_ptr, n, exact, address) and friends, and float32_difference; see onepass.c for
 * what they write. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "onepass.c"

typedef void (*kernel_fn)(const void *, int64_t, int, double *);

/* From this size (~10 us of reading) other Python threads may run during the read; below it,
 * releasing and taking the GIL back costs more than the read. Same value as native.py. */
#define GIL_RELEASE_NUMEL (1 << 16)

static PyObject *run(kernel_fn kernel, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "kernel(data_ptr, n, exact, address) takes 4 arguments");
        return NULL;
    }
    const void *x = PyLong_AsVoidPtr(args[0]);
    long long n = PyLong_AsLongLong(args[1]);
    int exact = PyObject_IsTrue(args[2]);
    double *out = (double *)PyLong_AsVoidPtr(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (n >= GIL_RELEASE_NUMEL) {
        Py_BEGIN_ALLOW_THREADS
        kernel(x, n, exact, out);
        Py_END_ALLOW_THREADS
    } else {
        kernel(x, n, exact, out);
    }
    Py_RETURN_NONE;
}

#define WRAP(NAME)                                                                  \
    static PyObject *py_##NAME(PyObject *self, PyObject *const *args, Py_ssize_t n) { \
        return run((kernel_fn)onepass_##NAME, args, n);                             \
    }
#define ENTRY(NAME) {#NAME, (PyCFunction)(void (*)(void))py_##NAME, METH_FASTCALL, NULL},

/* float32_difference(a_ptr, b_ptr, n, exact, address) -> bool: see onepass.c */
static PyObject *py_float32_difference(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "float32_difference(a_ptr, b_ptr, n, exact, address) takes 5 arguments");
        return NULL;
    }
    const float *a = (const float *)PyLong_AsVoidPtr(args[0]);
    const float *b = (const float *)PyLong_AsVoidPtr(args[1]);
    long long n = PyLong_AsLongLong(args[2]);
    int exact = PyObject_IsTrue(args[3]);
    double *out = (double *)PyLong_AsVoidPtr(args[4]);
    if (PyErr_Occurred()) return NULL;
    int done;
    if (n >= GIL_RELEASE_NUMEL) {
        Py_BEGIN_ALLOW_THREADS
        done = onepass_float32_difference(a, b, n, exact, out);
        Py_END_ALLOW_THREADS
    } else {
        done = onepass_float32_difference(a, b, n, exact, out);
    }
    return PyBool_FromLong(done);
}

WRAP(float32)
WRAP(float64)
WRAP(bfloat16)
#ifdef __FLT16_MAX__
WRAP(float16)
#endif

static PyMethodDef methods[] = {
    ENTRY(float32) ENTRY(float64) ENTRY(bfloat16) ENTRY(float32_difference)
#ifdef __FLT16_MAX__
    ENTRY(float16)
#endif
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_onepass", NULL, -1, methods};

PyMODINIT_FUNC PyInit__onepass(void) { return PyModule_Create(&module); }
