"""Platform adapters. ``adapters/lambda`` is loaded by file path (``lambda`` is a keyword) and
``adapters/modal/app.py`` is a Modal entry file; ``adapters.sagemaker`` is a package."""
