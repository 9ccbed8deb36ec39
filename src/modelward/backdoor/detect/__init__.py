"""Backdoor detection at three places: the model without its training data (:mod:`.model`), the training data
when it is given (:mod:`.data`), and single inputs at the API (:mod:`.input`)."""
