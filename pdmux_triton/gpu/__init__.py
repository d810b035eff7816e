"""The model made of kernels and what serves it on a GPU: streams, green contexts, KV pages, graphs."""
