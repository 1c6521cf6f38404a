"""The ``torch.backends`` entry point (pyproject.toml): torch >= 2.5 calls it at ``import torch``
(unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so ``dist.init_process_group("railyard")`` works
without ``import railyard.torch``. It must never break ``import torch``: a failure to register is
a warning, and the backend is then one explicit ``import railyard.torch`` away (which raises the
real error)."""

import warnings


def autoload() -> None:
    try:
        import railyard.torch  # noqa: F401  (registers the "railyard" backend)
    except Exception as err:  # pragma: no cover - depends on the environment
        warnings.warn(f"railyard: the torch.distributed backend was not registered: {err!r}; "
                      "import railyard.torch to see why", RuntimeWarning, stacklevel=2)
