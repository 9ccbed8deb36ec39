"""Model-level detection without the training data: Neural Cleanse (trigger reverse-engineering, MAD anomaly index
over classes) and MM-BD (data-free maximum-margin statistic); both give a :class:`~.base.ModelVerdict`."""
