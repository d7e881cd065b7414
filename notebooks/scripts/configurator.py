# Command-line overrides in the shape of nanoGPT's configurator: exec'd by the training script,
# each `--key=value` replaces a global of the same name and type.
import sys
from ast import literal_eval

for _arg in sys.argv[1:]:
    _key, _, _text = _arg.lstrip("-").partition("=")
    if _key not in globals():
        raise ValueError(f"Unknown config key: {_key}")
    try:
        _value = literal_eval(_text)
    except (SyntaxError, ValueError):
        _value = _text
    assert type(_value) is type(globals()[_key]), f"{_key}: {_value!r}"
    globals()[_key] = _value
