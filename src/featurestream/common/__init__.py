"""What the control plane (``core``, ``backends``) and the data plane (``stores``) both need, below both.

``refs`` (``SampleRef``, ``FeatureSpec``, ``FeatureAlgorithm``), ``checks`` (argument checks) and ``errors``
(the typed errors); nothing here imports another featurestream package.
"""
