"""The row layout every model's decoding cache shares: B sentences of K beams as B*K rows,
row b * K + i holding beam i of sentence b."""

import torch


def sentence_rows(sentences: torch.Tensor, beams: int) -> torch.Tensor:
    """The rows of these sentences (indices), every beam of each, in order."""
    beam = torch.arange(beams, device=sentences.device)
    return (sentences[:, None] * beams + beam).view(-1)
