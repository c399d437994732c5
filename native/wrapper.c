/* placeholder: replaced by the real implementation */
int main(void){return 1;}
