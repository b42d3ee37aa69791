// model.cpp: (to be written)
