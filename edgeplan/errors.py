"""One error type per failure a user can act on. Each message says what, where, and what to do."""


class EdgeplanError(Exception):
    """Base of every error edgeplan raises on purpose (the CLI prints these without a traceback)."""


class ModelNotFoundError(EdgeplanError):
    """The model path does not exist."""


class CorruptModelError(EdgeplanError):
    """The file exists but cannot be parsed as the model format its name or content claims."""


class UnsupportedModelError(EdgeplanError):
    """The model parses but uses something edgeplan cannot handle (format, several inputs, ...)."""


class DynamicShapeError(EdgeplanError):
    """A non-batch dimension is dynamic and no --input-shape gives it."""


class ConversionError(EdgeplanError):
    """The int8 TFLite conversion failed; the message names the ONNX op when the converter said which."""


class ModelTooLargeError(EdgeplanError):
    """The model file (or SavedModel directory) is over params.yaml ``ingest.max_model_bytes``."""


class InsufficientMemoryError(EdgeplanError):
    """A stage of the compile is estimated to need more memory than is available (or than --max-memory allows)."""


class ModelVersionConflictError(EdgeplanError):
    """A model name and version that already hold another model."""


class CutError(EdgeplanError):
    """A tensor cannot be used as a cut of a graph (it is not a single-tensor cut, or it is unknown)."""


class CompilerError(EdgeplanError):
    """The Edge TPU compiler (real or emulated) failed on a model."""


class CalibrationError(EdgeplanError):
    """The representative data for int8 calibration is missing or does not fit the model's input."""


class AccuracyGateError(EdgeplanError):
    """The labelled evaluation set is unreadable or does not fit the model, or a model failed the accuracy gate."""


class ArtifactError(EdgeplanError):
    """An artifact directory is missing a file a stage needs, or a file has an unknown schema."""


class RegistryError(EdgeplanError):
    """The fleet registry (params.yaml ``fleet``) is malformed, or names a device class it does not define."""


class ProfileError(EdgeplanError):
    """Profiling cannot start or its inputs disagree (no segments, profiles of different models, ...)."""


class PlanError(EdgeplanError):
    """No plan can be made: no stable configuration at the given rates, or the deployment is inconsistent."""


class MemoryBudgetError(PlanError):
    """A memory budget (FlashMem's M_peak) below what some layer needs however the plan streams."""


class StoreError(EdgeplanError):
    """The object store cannot be reached or refused an operation; the message names the store and the key."""


class StoreKeyNotFound(StoreError):
    """A key the operation needs is not in the store."""


class SigningKeyError(EdgeplanError):
    """The signing key is missing, unreadable, not ed25519, or not one the deployment's devices trust."""


class BundleVerificationError(EdgeplanError):
    """A manifest, a ``latest`` pointer or a blob fails its signature or checksum, or names an unknown key."""


class PublishConflictError(EdgeplanError):
    """What is being published contradicts what the store holds (another model under the same name and
    version, a revision written meanwhile by someone else)."""


class SpecError(EdgeplanError):
    """A platform or mapping specification (multi-device) that does not fit the model or the fleet."""
