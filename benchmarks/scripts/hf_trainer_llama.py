"""A tiny Llama trained by the real Hugging Face `transformers.Trainer`, as a user's script
would: `LlamaForCausalLM` from a config (random weights, no download), a dataset of random
token ids, `TrainingArguments` with no device named, `trainer.train()`. What the Trainer adds
to a step (its accelerate-prepared optimizer and data loader, the scheduler, gradient
clipping, its callbacks) is what issue 40's "HF Trainer, a tiny Llama" row measured; the
corpus's healthy_hf_llama.py writes the loop by hand. Here, not in the corpus, because the tests
run every corpus script and transformers is only in the test extra.

    python hf_trainer_llama.py --steps 300

Without transformers it prints why and exits 0 (benchmarks/real_scripts.py leaves the row out).
"""

import argparse
import tempfile


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    except ImportError as error:  # the row is optional: say why it did not run
        print(f"skipped: transformers is not importable ({type(error).__name__}: {error}); "
              "pip install transformers")
        return

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, config.vocab_size, (64, 32))
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    with tempfile.TemporaryDirectory() as output_dir:
        training = TrainingArguments(output_dir=output_dir, max_steps=args.steps,
                                     per_device_train_batch_size=8, learning_rate=1e-3,
                                     logging_steps=args.steps, save_strategy="no",
                                     report_to=[], disable_tqdm=True, seed=0)
        Trainer(model=model, args=training, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
