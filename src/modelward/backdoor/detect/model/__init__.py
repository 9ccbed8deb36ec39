"""Model-level detection without the training data: Neural Cleanse (trigger reverse-engineering, MAD anomaly index
over classes), MM-BD (data-free maximum-margin statistic), the BatchNorm shift (running statistics against the
defender's clean data) and MNTD (a meta-classifier on shadow models); each gives a :class:`~.base.ModelVerdict`."""
