"""SageMaker serving contract on top of the one app: ``/ping``, ``/invocations``, ``/opt/ml/model``."""

from adapters.sagemaker.invocations import create_sagemaker_app
from adapters.sagemaker.models import sagemaker_settings

__all__ = ["create_sagemaker_app", "sagemaker_settings"]
