"""Queue backends beyond the in-process ``SampleRefQueue``, each a ``featurestream.core.protocol.LeaseQueue``."""
