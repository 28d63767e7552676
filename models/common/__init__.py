"""Building blocks shared by the native families: layers, RoPE, checkpoint I/O, tie policy."""
