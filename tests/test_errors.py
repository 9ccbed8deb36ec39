from modelward.errors import ConfigError, DataError


def test_config_and_data_errors_are_value_errors() -> None:
    assert issubclass(ConfigError, ValueError) and issubclass(DataError, ValueError)
