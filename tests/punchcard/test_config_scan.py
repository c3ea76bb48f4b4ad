"""The JSON scan's rule for classes outside Keras, on one object (no server, no Keras)."""

import pytest

from distkeras.punchcard.config_scan import ConfigRefused, scan


def _layer(module, class_name, registered_name=None):
    item = {"module": module, "class_name": class_name, "config": {"name": "x"}}
    if registered_name is not None:
        item["registered_name"] = registered_name
    return {"module": "keras", "class_name": "Sequential", "config": {"layers": [item]}}


@pytest.mark.parametrize("module, class_name", [
    ("builtins", "eval"), ("os", "system"), ("subprocess", "Popen"),
    ("importlib", "import_module"), ("_io", "open"), ("posix", "system")])
def test_a_standard_module_class_is_refused_before_the_registry_is_known(module, class_name):
    with pytest.raises(ConfigRefused, match="neither Keras's nor registered"):
        scan(_layer(module, class_name), registered=None)


def test_a_packages_class_waits_for_the_registry_then_must_be_registered():
    config = _layer("mypackage.layers", "Scale", "mypackage>Scale")
    scan(config, registered=None)  # the front's scan: checked again with the registry
    scan(config, registered={"mypackage>Scale"})  # registered on the server: built
    with pytest.raises(ConfigRefused, match="module mypackage.layers"):
        scan(config, registered={"other>Thing"})
    with pytest.raises(ConfigRefused, match="neither Keras's nor registered"):
        scan(_layer("numpy", "ndarray"), registered=set())


def test_keras_classes_still_pass():
    scan(_layer("keras.layers", "Dense"), registered=set())
