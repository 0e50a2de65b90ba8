"""Real Keras/TensorFlow models people train, the Keras side of the models
matrix: ``keras.applications`` networks (``weights=None``, 32x32 images,
``fit``), recurrent text models with masking, an attention encoder block, a
transposed-convolution autoencoder, and one CNN trained three ways (a custom
``@tf.function`` GradientTape loop, ``fit`` under ``MirroredStrategy``).

Each case says how to build the model, how to make its data, and how it
trains (``fit`` with ``tracelog.keras.TracelogCallback``, or a custom loop
with ``tracelog.Listener``), so ``benchmarks/models_matrix.py --keras`` and the
tests drive them the same way. Two batches each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf

L = keras.layers
VOCAB = 50
Data = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class KerasCase:
    name: str
    build: Callable[[], Any]
    data: Callable[[np.random.Generator], Data]  # two batches' worth: (x, y)
    loss: Callable[[], Any]
    how: str = "fit"  # "fit", "tf_function" (a custom @tf.function loop), "mirrored"
    batch_size: int = 4
    in_suite: bool = True  # False: minutes at 32x32, run by the models matrix script only


def _images(classes: int = 10, size: int = 32, n: int = 8) -> Callable[..., Data]:
    def make(rng: np.random.Generator) -> Data:
        x = rng.random((n, size, size, 3)).astype("float32")
        return x, rng.integers(0, classes, n)

    return make


def _application(name: str, size: int = 32) -> Callable[[], Any]:
    def build() -> Any:
        cls = getattr(keras.applications, name)
        return cls(weights=None, input_shape=(size, size, 3), classes=10)

    return build


def _sparse_ce(from_logits: bool = False) -> Callable[[], Any]:
    return lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


# -- recurrent text models -------------------------------------------------------------------
def _padded_ids(rng: np.random.Generator, n: int, t: int) -> np.ndarray:
    """Token ids right-padded with 0 (the mask): row k keeps t - k % 3 tokens."""
    ids = rng.integers(1, VOCAB, (n, t)).astype("int32")
    for k in range(n):
        ids[k, t - k % 3 :] = 0
    return ids


def _lstm_classifier() -> Any:
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            L.Embedding(VOCAB, 16, mask_zero=True),
            L.LSTM(16, return_sequences=True),
            L.LSTM(12),
            L.Dense(3),
        ]
    )


def _text_classes(rng: np.random.Generator) -> Data:
    return _padded_ids(rng, 8, 9), rng.integers(0, 3, 8)


def _gru_tagger() -> Any:
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            L.Embedding(VOCAB, 16, mask_zero=True),
            L.Bidirectional(L.GRU(12, return_sequences=True)),
            L.Dense(5),
        ]
    )


def _tags(rng: np.random.Generator) -> Data:
    return _padded_ids(rng, 8, 9), rng.integers(0, 5, (8, 9))


# -- attention and convolution blocks ----------------------------------------------------------
def _attention_encoder() -> Any:
    x = keras.Input((10, 16))
    h = L.MultiHeadAttention(num_heads=2, key_dim=8, dropout=0.1)(x, x)
    h = L.LayerNormalization()(L.Add()([x, L.Dropout(0.1)(h)]))
    f = L.Dense(16)(L.Dense(32, activation="gelu")(h))
    h = L.LayerNormalization()(L.Add()([h, f]))
    return keras.Model(x, L.Dense(4)(L.GlobalAveragePooling1D()(h)))


def _sequences(rng: np.random.Generator) -> Data:
    return rng.standard_normal((8, 10, 16)).astype("float32"), rng.integers(0, 4, 8)


def _autoencoder() -> Any:
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            L.Conv2D(8, 3, strides=2, padding="same"),
            L.GroupNormalization(groups=4),
            L.Activation("relu"),
            L.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            L.Conv2DTranspose(8, 3, strides=2, padding="same"),
            L.GroupNormalization(groups=2),
            L.Activation("relu"),
            L.Conv2DTranspose(3, 3, strides=2, padding="same", activation="sigmoid"),
        ]
    )


def _reconstruct(rng: np.random.Generator) -> Data:
    x = rng.random((8, 16, 16, 3)).astype("float32")
    return x, x


def _cnn() -> Any:
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            L.Conv2D(8, 3, padding="same", activation="relu"),
            L.BatchNormalization(),
            L.MaxPooling2D(),
            L.Conv2D(16, 3, activation="relu"),
            L.GlobalAveragePooling2D(),
            L.Dropout(0.2),
            L.Dense(10),
        ]
    )


def _app(name: str, application: str) -> KerasCase:
    """A keras.applications model at 32x32, two batches of 8 (issue 14's
    configuration): at batch 4 the batch norms of the 1x1 blocks take their
    statistics over 4 values, and the float32 ratios are draws around 2
    (MobileNetV2: 2.05 to 2.56 over seeds; README, known limits)."""
    return KerasCase(
        name, _application(application), _images(n=16), _sparse_ce(), batch_size=8, in_suite=False
    )


CASES: list[KerasCase] = [
    _app("mobilenet_v2", "MobileNetV2"),
    _app("resnet50", "ResNet50"),
    _app("efficientnet_b0", "EfficientNetB0"),
    _app("densenet121", "DenseNet121"),
    _app("convnext_tiny", "ConvNeXtTiny"),
    KerasCase("lstm_classifier", _lstm_classifier, _text_classes, _sparse_ce(True)),
    KerasCase("bigru_tagger", _gru_tagger, _tags, _sparse_ce(True)),
    KerasCase("attention_encoder", _attention_encoder, _sequences, _sparse_ce(True)),
    KerasCase(
        "convtranspose_autoencoder",
        _autoencoder,
        _reconstruct,
        lambda: keras.losses.MeanSquaredError(),
    ),
    KerasCase("cnn_tf_function", _cnn, _images(10, 16), _sparse_ce(True), how="tf_function"),
    KerasCase("cnn_mirrored", _cnn, _images(10, 16), _sparse_ce(True), how="mirrored"),
]


def _extra_app(name: str, application: str, size: int = 32) -> KerasCase:
    """A keras.applications family no issue names, as ``_app`` builds the
    matrix's (``size``: the family's smallest input, where 32 is below it)."""
    return KerasCase(
        name,
        _application(application, size),
        _images(size=size, n=16),
        _sparse_ce(),
        batch_size=8,
        in_suite=False,
    )


# families no issue names (``models_matrix.py --keras --extra``): built from
# the ops' meaning, tried on every release
EXTRA_CASES: list[KerasCase] = [
    _extra_app("xception", "Xception", 71),
    _extra_app("inception_v3", "InceptionV3", 75),
    _extra_app("mobilenet_v3_small", "MobileNetV3Small"),
    _extra_app("mobilenet", "MobileNet"),
    _extra_app("vgg16", "VGG16"),
    _extra_app("resnet50_v2", "ResNet50V2"),
    _extra_app("efficientnet_v2_b0", "EfficientNetV2B0"),
    _extra_app("nasnet_mobile", "NASNetMobile"),
    _extra_app("inception_resnet_v2", "InceptionResNetV2", 75),
]


# -- models in the style of the keras.io examples, and MobileNetV3Large
# (first tried 2026-11-29)
class _CTokenAndPosition(L.Layer):
    """keras.io "text classification with transformer": a token embedding plus
    a learned embedding of the position."""

    def __init__(self, maxlen: int, vocab: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.token = L.Embedding(vocab, dim)
        self.position = L.Embedding(maxlen, dim)

    def call(self, x: Any) -> Any:
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.token(x) + self.position(positions)


def _text_transformer() -> Any:
    x = keras.Input((12,), dtype="int32")
    h = _CTokenAndPosition(12, VOCAB, 16)(x)
    a = L.MultiHeadAttention(num_heads=2, key_dim=16)(h, h)
    h = L.LayerNormalization(epsilon=1e-6)(h + L.Dropout(0.1)(a))
    f = L.Dense(16)(L.Dense(32, activation="relu")(h))
    h = L.LayerNormalization(epsilon=1e-6)(h + L.Dropout(0.1)(f))
    h = L.Dropout(0.1)(L.GlobalAveragePooling1D()(h))
    h = L.Dropout(0.1)(L.Dense(20, activation="relu")(h))
    return keras.Model(x, L.Dense(2, activation="softmax")(h))


def _masked_transformer() -> Any:
    """A padding mask from ``Embedding(mask_zero=True)`` that Keras carries into
    MultiHeadAttention (query and key masks, causal too) and into the
    mask-aware average pooling (keras.io's sequence-to-sequence Transformer)."""
    x = keras.Input((None,), dtype="int32")
    h = L.Embedding(VOCAB, 16, mask_zero=True)(x)
    a = L.MultiHeadAttention(num_heads=2, key_dim=8)(h, h, use_causal_mask=True)
    h = L.LayerNormalization()(L.Add()([h, a]))
    return keras.Model(x, L.Dense(3)(L.GlobalAveragePooling1D()(h)))


def _token_classes(rng: np.random.Generator) -> Data:
    return rng.integers(1, VOCAB, (8, 12)).astype("int32"), rng.integers(0, 2, 8)


def _bilstm_text() -> Any:
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            L.Embedding(VOCAB, 16, mask_zero=True),
            L.Bidirectional(L.LSTM(12, return_sequences=True)),
            L.Bidirectional(L.LSTM(8)),
            L.Dense(1, activation="sigmoid"),
        ]
    )


def _binary_text(rng: np.random.Generator) -> Data:
    return _padded_ids(rng, 8, 9), rng.integers(0, 2, (8, 1)).astype("float32")


def _conv1d_text() -> Any:
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            L.Embedding(VOCAB, 16),
            L.Dropout(0.2),
            L.Conv1D(16, 5, padding="valid", activation="relu", strides=2),
            L.Conv1D(16, 3, padding="valid", activation="relu"),
            L.GlobalMaxPooling1D(),
            L.Dense(16, activation="relu"),
            L.Dense(1, activation="sigmoid"),
        ]
    )


def _binary_long_text(rng: np.random.Generator) -> Data:
    return rng.integers(1, VOCAB, (8, 20)).astype("int32"), rng.integers(0, 2, (8, 1)).astype(
        "float32"
    )


def _masked_gru() -> Any:
    return keras.Sequential(
        [
            keras.Input((None, 4)),
            L.Masking(mask_value=0.0),
            L.GRU(12, return_sequences=True),
            L.GRU(8),
            L.Dense(3),
        ]
    )


def _padded_series(rng: np.random.Generator) -> Data:
    x = rng.standard_normal((8, 9, 4)).astype("float32")
    for k in range(8):
        x[k, 9 - k % 3 :] = 0.0
    return x, rng.integers(0, 3, 8)


class _CSampling(L.Layer):
    """keras.io "variational autoencoder": z = mean + exp(log_var / 2) * eps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs: Any) -> Any:
        mean, log_var = inputs
        eps = keras.random.normal(keras.ops.shape(mean), seed=self.seed_generator)
        return mean + keras.ops.exp(0.5 * log_var) * eps


def _vae() -> Any:
    x = keras.Input((12, 12, 1))
    h = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
    h = L.Dense(16, activation="relu")(L.Flatten()(h))
    z = _CSampling()([L.Dense(2)(h), L.Dense(2)(h)])
    h = L.Reshape((6, 6, 8))(L.Dense(6 * 6 * 8, activation="relu")(z))
    h = L.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(h)
    return keras.Model(x, L.Conv2DTranspose(1, 3, padding="same", activation="sigmoid")(h))


class _CSamplingKL(_CSampling):
    """The sampling layer with the KL divergence to N(0, 1) as an ``add_loss``
    (the loss a VAE trained by plain ``fit`` adds to its reconstruction)."""

    def call(self, inputs: Any) -> Any:
        mean, log_var = inputs
        kl = -0.5 * keras.ops.sum(1 + log_var - keras.ops.square(mean) - keras.ops.exp(log_var), 1)
        self.add_loss(keras.ops.mean(kl) * 0.01)
        return super().call(inputs)


def _vae_kl() -> Any:
    x = keras.Input((12, 12, 1))
    h = L.Dense(16, activation="relu")(L.Flatten()(x))
    z = _CSamplingKL()([L.Dense(2)(h), L.Dense(2)(h)])
    h = L.Dense(144, activation="sigmoid")(L.Dense(16, activation="relu")(z))
    return keras.Model(x, L.Reshape((12, 12, 1))(h))


def _reconstruct_gray(rng: np.random.Generator) -> Data:
    x = rng.random((8, 12, 12, 1)).astype("float32")
    return x, x


def _preprocessed_cnn() -> Any:
    norm = L.Normalization(mean=[0.4, 0.5, 0.6], variance=[0.04, 0.05, 0.06])
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            L.Rescaling(1.0 / 255),
            norm,
            L.RandomFlip("horizontal"),
            L.Conv2D(8, 3, padding="same"),
            L.GroupNormalization(groups=4),
            L.Activation("relu"),
            L.MaxPooling2D(),
            L.SeparableConv2D(16, 3, padding="same", activation="relu"),
            L.GlobalAveragePooling2D(),
            L.UnitNormalization(),
            L.Dense(10),
        ]
    )


def _bytes_images(rng: np.random.Generator) -> Data:
    return (rng.random((8, 16, 16, 3)) * 255).astype("float32"), rng.integers(0, 10, 8)


def _unet() -> Any:
    x = keras.Input((16, 16, 3))
    d1 = L.Conv2D(8, 3, padding="same", activation="relu")(x)
    d2 = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(L.BatchNormalization()(d1))
    b = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(d2)
    u2 = L.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(b)
    u2 = L.Conv2D(16, 3, padding="same", activation="relu")(L.Concatenate()([u2, d2]))
    u1 = L.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(u2)
    u1 = L.Concatenate()([u1, d1])
    return keras.Model(x, L.Conv2D(3, 1, activation="softmax")(u1))


def _pixel_classes(rng: np.random.Generator) -> Data:
    return rng.random((8, 16, 16, 3)).astype("float32"), rng.integers(0, 3, (8, 16, 16))


def _series_regressor() -> Any:
    return keras.Sequential(
        [
            keras.Input((24, 3)),
            L.Conv1D(8, 3, padding="causal", activation="relu"),
            L.MaxPooling1D(2),
            L.LSTM(12),
            L.Dense(2),
        ]
    )


def _series(rng: np.random.Generator) -> Data:
    x = rng.standard_normal((8, 24, 3)).astype("float32")
    return x, rng.standard_normal((8, 2)).astype("float32")


def _recommender() -> Any:
    users, items = keras.Input((1,), dtype="int32"), keras.Input((1,), dtype="int32")
    u = L.Flatten()(L.Embedding(20, 8)(users))
    v = L.Flatten()(L.Embedding(30, 8)(items))
    ub = L.Flatten()(L.Embedding(20, 1)(users))
    vb = L.Flatten()(L.Embedding(30, 1)(items))
    score = L.Add()([L.Dot(axes=1)([u, v]), ub, vb])
    return keras.Model([users, items], L.Activation("sigmoid")(score))


def _ratings(rng: np.random.Generator) -> Any:
    x = [rng.integers(0, 20, (8, 1)).astype("int32"), rng.integers(0, 30, (8, 1)).astype("int32")]
    return x, rng.integers(0, 2, (8, 1)).astype("float32")


def _two_heads() -> Any:
    x = keras.Input((10,))
    h = L.Dense(16, activation="relu")(x)
    return keras.Model(x, [L.Dense(3, name="kind")(h), L.Dense(1, name="size")(h)])


def _two_targets(rng: np.random.Generator) -> Any:
    x = rng.standard_normal((8, 10)).astype("float32")
    return x, [rng.integers(0, 3, 8), rng.standard_normal((8, 1)).astype("float32")]


EXTRA_CASES += [
    KerasCase("text_transformer", _text_transformer, _token_classes, _sparse_ce()),
    KerasCase("masked_transformer", _masked_transformer, _text_classes, _sparse_ce(True)),
    KerasCase("bilstm_text", _bilstm_text, _binary_text, lambda: keras.losses.BinaryCrossentropy()),
    KerasCase(
        "conv1d_text",
        _conv1d_text,
        _binary_long_text,
        lambda: keras.losses.BinaryCrossentropy(),
    ),
    KerasCase("masked_gru", _masked_gru, _padded_series, _sparse_ce(True)),
    KerasCase("vae", _vae, _reconstruct_gray, lambda: keras.losses.BinaryCrossentropy()),
    KerasCase("vae_kl", _vae_kl, _reconstruct_gray, lambda: keras.losses.BinaryCrossentropy()),
    KerasCase("preprocessed_cnn", _preprocessed_cnn, _bytes_images, _sparse_ce(True)),
    KerasCase("unet", _unet, _pixel_classes, _sparse_ce()),
    KerasCase("series_regressor", _series_regressor, _series, lambda: keras.losses.Huber()),
    KerasCase("recommender", _recommender, _ratings, lambda: keras.losses.BinaryCrossentropy()),
    KerasCase(
        "two_heads",
        _two_heads,
        _two_targets,
        lambda: [keras.losses.SparseCategoricalCrossentropy(True), keras.losses.MeanSquaredError()],
    ),
    _extra_app("mobilenet_v3_large", "MobileNetV3Large"),
]
BY_NAME = {c.name: c for c in CASES + EXTRA_CASES}


def _fit(model: Any, case: KerasCase, x: np.ndarray, y: np.ndarray, callback: Any) -> None:
    model.fit(
        x, y, batch_size=case.batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[callback]
    )


def train(case: KerasCase, log_dir: Any, seed: int = 0, **options: Any) -> Any:
    """Train two batches of ``case`` under tracelog; return the closed log."""
    import tracelog
    from tracelog.keras import TracelogCallback

    keras.backend.clear_session()  # the same layer names in every run
    keras.utils.set_random_seed(seed)
    x, y = case.data(np.random.default_rng(seed))
    if case.how == "mirrored":
        strategy = tf.distribute.MirroredStrategy(
            [d.name for d in tf.config.list_logical_devices("CPU")]
        )
        with strategy.scope():
            model = case.build()
            model.compile(optimizer="sgd", loss=case.loss())
        _fit(model, case, x, y, TracelogCallback(log_dir, **options))
        return tracelog.load(log_dir)
    model = case.build()
    if case.how == "fit":
        model.compile(optimizer="sgd", loss=case.loss())
        _fit(model, case, x, y, TracelogCallback(log_dir, **options))
        return tracelog.load(log_dir)
    # a custom loop: the step is a tf.function, the window wraps its call
    loss_fn, opt = case.loss(), keras.optimizers.SGD(0.01)

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    listener = tracelog.Listener(model, log_dir, **options)
    for i in range(0, len(x), case.batch_size):
        with listener.batch():
            train_step(
                tf.constant(x[i : i + case.batch_size]), tf.constant(y[i : i + case.batch_size])
            )
    return listener.close()


def use_logical_cpus(n: int = 2) -> int:
    """Split the CPU into ``n`` logical devices for MirroredStrategy; only before
    TensorFlow initialises its devices. Returns how many there are."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError:  # already initialised: keep what there is
        pass
    return len(tf.config.list_logical_devices("CPU"))
