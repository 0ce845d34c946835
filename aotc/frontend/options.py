"""Import options that change a model's arithmetic: kept free of imports so the CLI can offer them."""

REQUANTIZE_CHOICES = ("float", "fixed_point")
DEFAULT_REQUANTIZE = "float"
"""How a TFLite model's int8 convs, depthwise convs and fully connected layers requantize their int32
sums, and how its int8 ADDs and MULs rescale. `float`: float32 multiplies (input_scale *
weight_scale / output_scale; each input's scale / output_scale; a_scale * b_scale / output_scale) rounded half to even, as LiteRT's
default XNNPACK kernels and onnxruntime's do on x86, a few vector instructions. `fixed_point`: the
integer multipliers and shifts of TFLite's builtin kernels, bit-exact against them, with 64-bit products
that cost several times as much (int8 MobileNetV2 224 on znver4: 1.4x the latency). The two differ by at
most 1 LSB in a layer's output."""
