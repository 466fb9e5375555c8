"""A user's raw script with shardtop's probe, as the README shows it, run by torchrun alone.

    SHARDTOP_RUN_DIR=/some/new/dir torchrun --standalone --nproc_per_node 2 tests/user_scripts/attach_raw.py

No process group: every rank trains its own copy; the run directory is the
one thing the ranks share.
"""

import torch
from torch import nn

import shardtop.probe as st

if __name__ == "__main__":
    with st.watch():
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        st.attach(model, optimizer=optimizer)
        for step in range(1, 3):
            st.phase("forward", step)
            loss = model(torch.randn(4, 8)).pow(2).mean()
            st.phase("backward")
            loss.backward()
            st.phase("optimizer")
            optimizer.step()
            st.step(step, loss=loss.item())
