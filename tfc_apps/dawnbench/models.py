"""The models of the DAWNBench script: Keras' ResNet-50 (channels-last, any input resolution, for
progressive resizing) and a small residual network for tests on small images."""
import keras

# The small model trains for tens of steps per epoch: its BN moving statistics must follow the
# weights within a few steps, or validation (which uses them) lags far behind training.
BN_MOMENTUM = 0.6


def build(name, num_classes, seed=0, channels=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None, None, channels))
    if name == "resnet50":
        features = keras.applications.ResNet50(weights=None, include_top=False, input_tensor=inputs,
                                               pooling="avg").output
    elif name == "small":
        features = _small_resnet(inputs)
    else:
        raise ValueError(f"model must be 'resnet50' or 'small', got {name!r}")
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(features)
    return keras.Model(inputs, logits, name=name)


def _block(x, filters, stride, name):
    layers = keras.layers
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, stride, use_bias=False, name=f"{name}_proj")(x)
        shortcut = layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"{name}_proj_bn")(shortcut)
    y = layers.Conv2D(filters, 3, stride, padding="same", use_bias=False, name=f"{name}_conv1")(x)
    y = layers.ReLU()(layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"{name}_bn1")(y))
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"{name}_bn2")(y)
    return layers.ReLU()(layers.Add()([shortcut, y]))


def _small_resnet(x):
    layers = keras.layers
    x = layers.Conv2D(32, 3, padding="same", use_bias=False, name="stem_conv")(x)
    x = layers.ReLU()(layers.BatchNormalization(momentum=BN_MOMENTUM, name="stem_bn")(x))
    x = _block(x, 32, 1, "block1")
    x = _block(x, 64, 2, "block2")
    x = _block(x, 128, 2, "block3")
    return layers.GlobalAveragePooling2D()(x)
