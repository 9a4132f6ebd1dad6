"""vit_jax_lab: one jit-sharded core for ViT, ViViT and seq2seq Transformers in JAX/Flax NNX."""
