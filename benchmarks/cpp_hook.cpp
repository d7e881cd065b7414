// A measurement, not part of the package: the forward hook's common case written in C++, to
// see what a module call costs when the hook's body makes no Python-level tensor calls.
// per_call.py builds it (cpp_hook.py) and times it as a global forward hook (with_kwargs) on
// mlp5000, beside the Python hook of inspect(model).
//
// The body is what the recorder's dense path does for one plain CPU float32 output of at most
// 16 384 values (recorder.py, `_record_dense`): the module's target looked up, its call
// counted, the same checks (strided, contiguous, not negated), the one-pass kernel's RAW row
// (onepass.c, the same function), and the row's metadata (step, target, call, shape, training).
// With record_grads(True), each such output also gets a C++ tensor hook that makes the same row
// of its gradient, which autograd calls without Python. What it leaves out, and a real one
// would need: other dtypes and devices, the Python path for everything else, parameter
// gradients, removing the tensor hooks at the step's end, the lock contract, and handing the
// rows to `flush`.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <unordered_map>
#include <vector>

extern "C" void onepass_float32(const float *x, int64_t n, int exact, double *out);

namespace {

struct Row {
    int64_t step;
    int target;
    int call;
    std::vector<int64_t> shape;
    bool training;
    size_t slot;
};

std::unordered_map<PyObject *, int> targets;  // module -> its target (the model's modules)
std::unordered_map<PyObject *, int> calls;    // module -> calls this step
std::vector<Row> rows;
std::vector<std::array<double, 8>> raw;       // RAW rows, as the kernel writes them
int64_t step = 0;
bool grads = false;  // also an output-gradient row, from a C++ tensor hook on each output
PyObject *training_name = nullptr;

// the dense row's checks and kernel call; false where the Python path would take the tensor
bool dense_row(const at::TensorBase &t, int target, int call, bool training) {
    int64_t n = t.numel();
    if (!(t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && n > 0 &&
          n <= 16384 && t.is_contiguous() && !t.is_neg()))
        return false;
    raw.emplace_back();
    onepass_float32(t.const_data_ptr<float>(), n, 0, raw.back().data());
    auto sizes = t.sizes();
    rows.push_back(Row{step, target, call, std::vector<int64_t>(sizes.begin(), sizes.end()),
                       training, raw.size() - 1});
    return true;
}

// hook(module, args, kwargs, output), torch's global forward hook with kwargs
PyObject *hook(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) Py_RETURN_NONE;
    PyObject *module = args[0], *output = args[3];
    auto found = targets.find(module);
    if (found == targets.end()) Py_RETURN_NONE;
    int call = calls[module]++;
    if (!THPVariable_CheckExact(output)) Py_RETURN_NONE;
    const at::Tensor &t = THPVariable_Unpack(output);
    PyObject *training = PyObject_GetAttr(module, training_name);
    bool is_training = training == Py_True;
    Py_XDECREF(training);
    int target = found->second;
    if (dense_row(t, target, call, is_training) && grads && t.requires_grad()) {
        // autograd calls it without Python (the rows of a step's backward follow its forward's)
        t.register_hook([target, call, is_training](const at::TensorBase &grad) {
            dense_row(grad, target, call, is_training);
        });
    }
    Py_RETURN_NONE;
}

PyMethodDef hook_method = {"hook", (PyCFunction)(void (*)(void))hook, METH_FASTCALL, nullptr};

}  // namespace

PYBIND11_MODULE(cpp_hook, m) {
    training_name = PyUnicode_InternFromString("training");
    m.def("add_target", [](py::handle module, int index) { targets[module.ptr()] = index; });
    m.def("next_step", [] { rows.clear(); raw.clear(); calls.clear(); step++; });
    m.def("record_grads", [](bool on) { grads = on; });
    m.def("rows", [] { return rows.size(); });
    m.def("forget", [] { targets.clear(); calls.clear(); rows.clear(); raw.clear(); });
    m.attr("hook") = py::reinterpret_steal<py::object>(PyCFunction_New(&hook_method, nullptr));
}
