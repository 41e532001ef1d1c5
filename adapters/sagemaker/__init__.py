"""SageMaker serving contract on top of the one app: ``/ping``, ``/invocations``, ``/opt/ml/model``."""

from adapters.sagemaker.invocations import install
from adapters.sagemaker.models import sagemaker_settings

__all__ = ["install", "sagemaker_settings"]
