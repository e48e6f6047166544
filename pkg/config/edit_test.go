package config

const childEnv = "HAGROUP_CONFIG_TEST_CHILD"

func runChild(string) int { return 2 }
