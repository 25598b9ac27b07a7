<!--message-->
