"""Input pipelines: TFDS + tf.data on the host, handed to JAX as global sharded arrays."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's C++ start-up chatter.

import tensorflow as tf  # noqa: E402

# TensorFlow only feeds data; an accelerator it grabbed would be taken from JAX.
tf.config.set_visible_devices([], 'GPU')
