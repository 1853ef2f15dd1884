"""ATTACK markup_error: an error message full of rich markup and terminal escapes (it used to crash
eval-suite and every later `kfuse report`, and reach the terminal raw)."""

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("[/] [bold red]pwned[/bold red] [link=file:///etc/passwd]x[/link] "
                           "\x1b[2J\x1b]0;title\x07 \x9b31m")
