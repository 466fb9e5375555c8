"""What one forward of ``qlora_cpu.py``'s model saves for backward, as torch itself sees it.

The model is built as ``qlora_cpu.py`` builds it (one process, gradient
checkpointing on) and called once on the first batch inside
``torch.autograd.graph.saved_tensors_hooks``.  Prints the bytes of the tensors
autograd saved for backward, each storage once, the parameters' storages left
out (``saved bytes=N``: with checkpointing, each decoder layer's input and
what the final norm, the head and the loss save), and the bytes of the batch
the model was called with (``batch bytes=N``).  No training step.
"""

from __future__ import annotations

import tempfile

import torch
from qlora_cpu import batch, qlora, saved_llama


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory:
        saved_llama(directory)
        model = qlora(directory, double_quant=False)
    model.train()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    tokens = batch(0, 0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=tokens, labels=tokens)
    print(f"saved bytes={sum(saved.values())}", flush=True)
    print(f"batch bytes={2 * tokens.numel() * tokens.element_size()}", flush=True)


if __name__ == "__main__":
    main()
