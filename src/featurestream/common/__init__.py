"""What the control plane (``core``, ``backends``) and the data plane (``stores``) both need, below both.

``refs`` (``SampleRef``, ``FeatureSpec``, ``FeatureAlgorithm``), ``checks`` (argument checks), ``errors``
(the typed errors), ``periodic`` (the daemon thread the reaper, the orphan sweep and the Mooncake heartbeat run
on) and ``exports`` (the packages' lazy exports); nothing here imports another featurestream package.
"""
