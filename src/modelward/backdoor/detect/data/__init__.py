"""Data-level detection when the training data is given: activation clustering, spectral signatures and SPECTRE;
each scores every training row (higher = more likely poisoned) and names the suspected rows (a
:class:`~.base.DataScan`)."""
