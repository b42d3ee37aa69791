// (to be written)
int main(){}
