"""tests/scripts/corpus/healthy_accelerate_loop.py with the real `accelerate.Accelerator` in
place of its stand-in: that script's loop itself (the model, an AdamW optimizer, a DataLoader
and a LambdaLR scheduler handed to `accelerator.prepare`, `accelerator.backward(loss)`,
`optimizer.step()`, `lr_scheduler.step()`, `optimizer.zero_grad()`, on a 4-module MLP), run
with accelerate's class, so the two rows of benchmarks/real_scripts.py differ only in it. What
accelerate adds to a step (its wrapped optimizer, scheduler and data loader, the device
placement of each batch) is what issue 40's "accelerate loop" row measured; the corpus's
stand-in leaves it out. Here, not in the corpus, because the tests run every corpus script and
accelerate is only in the test extra.

    python accelerate_mlp_loop.py --steps 300

Without accelerate it prints why and exits 0 (benchmarks/real_scripts.py leaves the row out).
"""

import importlib.util
import sys
from pathlib import Path

LOOP = (Path(__file__).resolve().parents[2] / "tests" / "scripts" / "corpus"
        / "healthy_accelerate_loop.py")


def main():
    try:
        from accelerate import Accelerator
    except ImportError as error:  # the row is optional: say why it did not run
        print(f"skipped: accelerate is not importable ({type(error).__name__}: {error}); "
              "pip install accelerate")
        return
    spec = importlib.util.spec_from_file_location("healthy_accelerate_loop", LOOP)
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)  # defines the loop and its stand-in; runs nothing
    loop.Accelerator = Accelerator  # the loop makes `Accelerator()` when it starts
    loop.main()


if __name__ == "__main__":
    sys.exit(main())
