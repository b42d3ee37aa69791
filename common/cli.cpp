// cli.cpp: (to be written)
