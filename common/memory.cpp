// memory.cpp: (to be written)
