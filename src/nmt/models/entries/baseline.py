"""torch.nn.Transformer, wrapped as the PyTorch translation tutorial does: the reference."""

from nmt.models.registry import ModelEntry

ENTRY = ModelEntry(
    "baseline", order=0, model="nmt.models.baseline:BaselineTransformer", encoder_decoder=True,
    reads_bos=False, exports=True,
    param_count="nmt.models.decoder_only.size:encoder_decoder_param_count", checks=(),
    to_scratch="nmt.models.mapping:baseline_to_scratch", takes_reference_weights=True)
